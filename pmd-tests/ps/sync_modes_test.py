#!/usr/bin/python3
"""Every synchronisation mode end to end, in processes: ps-server and ps-worker processes
over net_memif (through ps-demo), and over net_af_packet in network namespaces on a bridge,
each with the link emulator losing 2 %, reordering 1 % and duplicating 1 % of the frames on
every TX queue. Each worker runs free-running rounds (ps-worker --compute-ms) with rank 1 a
straggler 3x slower, then checks the final parameters bit for bit: every rank's every
gradient applied exactly once (values on a grid, so any order gives the same result;
psplus with staleness_lr none for that, its learning-rate rule is unit-tested in lib/agg).
Also checked: the server's count of updates, exactly one per chunk per push (and version
0), ssp's largest gap to the slowest never above its bound, no pull delivering an older
version than the one before, and the server's clean stop.

`optimizers`: bsp with momentum, adam, momentum with weight decay and adamw over memif,
every round's aggregate checked bit for bit against ps-worker's replay of the servers'
optimizer (its state carried from round to round); and momentum and adam under psplus and adam under bsp in free-running
rounds, every rank pushing the same gradient so that the end state is the optimizer's
step replayed once per push; under asp and ssp (which send a worker only its own updates)
ps-worker refuses to check momentum's end state, saying why.

`half`: every mode over memif again with half-precision tensors (ps-worker --dtype mixed:
the tensors float32, bfloat16 and float16 in turn), sgd, and momentum under psplus: the
servers' float32 master parameters end exactly as the float32 job's (the grid's values are
exact in both dtypes), and each half-precision tensor must hold them rounded once into its
dtype, bit for bit.

  sync_modes_test.py BUILD_DIR MODEL_FILE [memif|namespaces|optimizers|half ...]
"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from netns import bridge_namespaces, remove_namespaces  # noqa: E402

MODES = [("asp", ""), ("ssp", "staleness_bound: 1, "), ("psplus", "staleness_lr: none, "),
         ("bsp", "")]
LINK = "link: {loss: 0.02, reorder: 0.01, duplicate: 0.01, seed: 7}"
ROUNDS = 4
WORKERS = 3


def job_head(mode, extra, name, optimizer="optimizer: sgd, learning_rate: 0.0625"):
    return "\n".join([
        "job: {id: 41, name: %s}" % name,
        "network: {mtu: 1500, peer_timeout_ms: 20000}",
        "mempool: {mbufs: 8191, cache: 128}",
        "eal: {memory_mb: 256, hugepages: off}",
        "training: {sync: %s, %s%s}" % (mode, extra, optimizer),
        LINK, ""])


def memif_job(mode, extra, tag, optimizer=None):
    head = job_head(mode, extra, tag) if optimizer is None else job_head(mode, extra, tag,
                                                                          optimizer)
    y = [head, "nodes:",
         "  - name: server0", "    role: server", "    ipv4: 10.0.0.1",
         "    mac: 02:00:00:00:00:01", "    ports:"]
    for w in range(WORKERS):
        y.append("      - net_memif%d,role=server,id=0,socket=/tmp/%s-w%d.sock" % (w, tag, w))
    y += ["    lcores: [0, 2]", "    shards: 1"]
    for w in range(WORKERS):
        y += ["  - name: w%d" % w, "    role: worker", "    ipv4: 10.0.0.%d" % (11 + w),
              "    mac: 02:00:00:00:00:%02x" % (0x11 + w),
              "    ports: [\"net_memif1%d,role=client,id=0,socket=/tmp/%s-w%d.sock\"]" % (w, tag, w),
              "    lcores: [%d]" % (1 + 2 * w)]
    return "\n".join(y) + "\n"


def check_workers(mode, text, what, sgd=True):
    """The workers' last lines: every one exact, ssp within its bound."""
    done = re.findall(r"(w\d+): done, .*", text)
    lines = re.findall(r"w\d+: done, .*", text)
    if len(done) != WORKERS:
        return "%s %s: %d of %d workers finished" % (what, mode, len(done), WORKERS)
    for line in lines:
        if ", the final parameters exact, drops:" not in line:
            return "%s %s: %s" % (what, mode, line)
        if mode == "ssp":
            gap = int(re.search(r"gap max (\d+)", line).group(1))
            if gap > 1:
                return "%s ssp: a worker went %d rounds ahead of the slowest, bound 1" % (what, gap)
    stopped = re.search(r"stopped; (\d+) aggregations", text)
    if not stopped:
        return "%s %s: the server did not stop cleanly" % (what, mode)
    # Exactly once, counted by the server: every chunk's version 0, then one
    # update per push (asynchronous: every rank's rounds and its final zero
    # push; bsp: one per round and the zero round).
    chunks = int(re.search(r"blocks placed \((\d+) chunks here\)", text).group(1))
    # sgd ends with a push of zeros in the asynchronous modes (free_rounds.h).
    pushes = WORKERS * (ROUNDS + (1 if sgd else 0)) if mode != "bsp" else ROUNDS
    if int(stopped.group(1)) != chunks * (1 + pushes):
        return "%s %s: the server applied %s updates, not %d chunks x %d" % (
            what, mode, stopped.group(1), chunks, 1 + pushes)
    return None


def run_memif(build, model, mode, extra, optimizer=None, dtype="float32"):
    tag = "mercury-sync-%s-%d" % (mode, os.getpid())
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(memif_job(mode, extra, tag, optimizer))
        job = f.name
    try:
        r = subprocess.run([os.path.join(build, "apps/ps-demo"), "--config", job, "--model",
                            model, "--rounds", str(ROUNDS), "--compute-ms", "5",
                            "--straggler", "1,3"] +
                           (["--dtype", dtype] if dtype != "float32" else []),
                           capture_output=True, text=True, timeout=600)
    finally:
        os.unlink(job)
    err = check_workers(mode, r.stdout, "memif" if dtype == "float32" else "memif " + dtype,
                        optimizer is None)
    if err is None and r.returncode != 0:
        err = "memif %s: ps-demo exited %d" % (mode, r.returncode)
    return err, r.stdout + r.stderr


OPTIMIZERS = ["optimizer: momentum, learning_rate: 0.01, momentum: 0.9",
              "optimizer: adam, learning_rate: 0.001, beta1: 0.9, beta2: 0.999, epsilon: 1.0e-8",
              # Weight decay: an L2 term, and AdamW's decoupled decay.
              "optimizer: momentum, learning_rate: 0.01, momentum: 0.9, weight_decay: 0.001",
              "optimizer: adamw, learning_rate: 0.001, weight_decay: 0.01"]
# Momentum and Adam in free-running rounds, where the end state can be read by every worker.
STATEFUL = [("psplus", "staleness_lr: none, ", OPTIMIZERS[0]),
            ("psplus", "staleness_lr: none, ", OPTIMIZERS[1]),
            ("bsp", "", OPTIMIZERS[1])]


def run_optimizer(build, model, optimizer):
    tag = "mercury-opt-%d" % os.getpid()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(memif_job("bsp", "", tag, optimizer))
        job = f.name
    try:
        r = subprocess.run([os.path.join(build, "apps/ps-demo"), "--config", job, "--model",
                            model, "--rounds", "3"],
                           capture_output=True, text=True, timeout=600)
    finally:
        os.unlink(job)
    rounds = re.findall(r"w\d+ round +\d+: .*every aggregate exact", r.stdout)
    if r.returncode != 0 or len(rounds) != 3 * WORKERS or "MISMATCH" in r.stdout:
        return "memif bsp %s: not every round exact" % optimizer, r.stdout + r.stderr
    return None, r.stdout


def refused_stateful(build, mode, extra):
    """ps-worker --compute-ms with momentum under `mode`: refused, saying why."""
    tag = "mercury-sync-refuse-%s-%d" % (mode, os.getpid())
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(memif_job(mode, extra, tag, OPTIMIZERS[0]))
        job = f.name
    try:
        r = subprocess.run([os.path.join(build, "apps/ps-worker/ps-worker"), "--config", job,
                            "--node", "w0", "--compute-ms", "5"],
                           capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(job)
    want = "%s sends each worker only the updates of its own pushes" % mode
    if r.returncode == 0 or want not in r.stderr:
        return "%s with momentum: ps-worker exited %d without refusing (%r)\n%s" % (
            mode, r.returncode, want, r.stdout[-1000:] + r.stderr[-1000:])
    return None


def run_namespaces(build, model, mode, extra):
    tag = "ms%d%s" % (os.getpid() % 10000, mode[:2])
    nodes = ["s0"] + ["w%d" % w for w in range(WORKERS)]
    ns = {}
    d = tempfile.mkdtemp(prefix="mercury-sync-")
    job = os.path.join(d, "job.yaml")
    procs = []
    try:
        ns = bridge_namespaces(tag, nodes)
        y = [job_head(mode, extra, tag), "nodes:",
             "  - {name: s0, role: server, ipv4: 10.79.0.1, ports: [\"net_af_packet0,iface=eth0\"],"
             " lcores: [0, 1], shards: 1}"]
        for w in range(WORKERS):
            y.append("  - {name: w%d, role: worker, ipv4: 10.79.0.%d, "
                     "ports: [\"net_af_packet%d,iface=eth0\"], lcores: [%d]}"
                     % (w, 11 + w, w + 1, (w + 1) % 2))
        with open(job, "w") as f:
            f.write("\n".join(y) + "\n")
        server = subprocess.Popen(
            ["ip", "netns", "exec", ns["s0"], os.path.join(build, "apps/ps-server"), "--config",
             job, "--node", "s0", "--seconds", "300"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(server)
        workers = []
        for w in range(WORKERS):
            p = subprocess.Popen(
                ["ip", "netns", "exec", ns["w%d" % w], os.path.join(build, "apps/ps-worker/ps-worker"),
                 "--config", job, "--node", "w%d" % w, "--model", model, "--rounds", str(ROUNDS),
                 "--compute-ms", "5", "--straggler", "1,3"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            procs.append(p)
            workers.append(p)
        out = ""
        status = 0
        for p in workers:
            o, _ = p.communicate(timeout=600)
            out += o
            status |= p.returncode
        subprocess.run(["pkill", "-INT", "-f", "--", "--config %s --node s0" % job])
        o, _ = server.communicate(timeout=60)
        out += o
        err = check_workers(mode, out, "namespaces")
        if err is None and (status != 0 or server.returncode != 0):
            err = "namespaces %s: a process failed" % mode
        return err, out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        subprocess.run(["pkill", "-KILL", "-f", "--", "--config %s" % job])
        remove_namespaces(ns)
        subprocess.run(["rm", "-rf", d])


def main():
    build, model = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    ways = sys.argv[3:] or ["memif", "namespaces", "optimizers"]
    failures = 0
    for way in ways:
        if way == "namespaces" and os.geteuid() != 0:
            print("sync modes: namespaces need root; not run")
            continue
        if way == "half":
            for mode, extra, optimizer in [(m, e, None) for m, e in MODES] + [STATEFUL[0]]:
                err, out = run_memif(build, model, mode, extra, optimizer, dtype="mixed")
                if err:
                    failures += 1
                    print("FAIL %s %s\n%s" % (err, optimizer or "sgd", out[-4000:]))
                else:
                    lines = re.findall(r"w\d+: done, .*", out)
                    print("ok memif %s %s, --dtype mixed: %d workers, rank 1 3x slower, 2 %% "
                          "loss; %s" % (mode, optimizer or "sgd", WORKERS,
                                        lines[0] if lines else ""))
                sys.stdout.flush()
            continue
        if way == "optimizers":
            for optimizer in OPTIMIZERS:
                err, out = run_optimizer(build, model, optimizer)
                if err:
                    failures += 1
                    print("FAIL %s\n%s" % (err, out[-4000:]))
                else:
                    print("ok memif bsp %s: %d workers x 3 rounds, every aggregate exact" %
                          (optimizer, WORKERS))
                sys.stdout.flush()
            for mode, extra, optimizer in STATEFUL:
                err, out = run_memif(build, model, mode, extra, optimizer)
                if err:
                    failures += 1
                    print("FAIL %s %s\n%s" % (err, optimizer, out[-4000:]))
                else:
                    print("ok memif %s %s: free-running, rank 1 3x slower, the final parameters "
                          "exact" % (mode, optimizer))
                sys.stdout.flush()
            # asp and ssp send a worker only its own updates: ps-worker refuses to check a
            # stateful optimizer's end state there (before EAL starts) rather than hang.
            for mode, extra in (("asp", ""), ("ssp", "staleness_bound: 1, ")):
                err = refused_stateful(build, mode, extra)
                if err:
                    failures += 1
                    print("FAIL %s" % err)
                else:
                    print("ok %s with momentum: ps-worker --compute-ms refuses it, naming why"
                          % mode)
                sys.stdout.flush()
            continue
        for mode, extra in MODES:
            run = run_memif if way == "memif" else run_namespaces
            err, out = run(build, model, mode, extra)
            if err:
                failures += 1
                print("FAIL %s\n%s" % (err, out[-4000:]))
            else:
                lines = re.findall(r"w\d+: done, .*", out)
                print("ok %s %s: %d workers, rank 1 3x slower, 2 %% loss; %s" %
                      (way, mode, WORKERS, lines[0] if lines else ""))
            sys.stdout.flush()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
