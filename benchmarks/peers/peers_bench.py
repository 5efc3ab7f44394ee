#!/usr/bin/python3
"""Mercury's push_pull beside a TCP parameter server and PyTorch's gloo all_reduce of the
same tensors, on the same machine, interleaved (benchmarks/peers/README.md).

  benchmarks/peers/peers_bench.py [--build build] [--models resnet50,vgg16] [--workers 2,4]
                                  [--trials 5] [--iters 10] [--warmup 3] [--csv FILE]
                                  [--loss P] [--compare-build DIR] [--bf16]
                                  [--checkpoint-every-s S] [--standby]

For each model and worker count, each trial runs four variants in random order:
  mercury     ps-demo on a memif job like config/memif.yaml (one ps-server, N ps-worker
              processes, optimizer sum): each round is a barrier of every rank, then
              push_pull of every tensor, last layer first, through the public worker API;
              every worker checks the last round's aggregate bit for bit (ps-worker
              --verify last: nothing but push_pull runs between rounds).
  tcp_ps      a classical parameter server over TCP on loopback (tcp_ps.py: one server
              process and N worker processes, synchronous push and pull per tensor, last
              layer first, each sum sent as soon as every worker's push of it arrived).
  gloo        torch.distributed all_reduce over gloo (TCP on loopback), N processes, one
              call per tensor, last layer first, issued at once and then waited for.
  gloo_fused  the same with one all_reduce of one flat buffer of every tensor.
With --loss P (e.g. 0.01), a fifth variant, mercury_loss: the mercury job with the link
emulator dropping a fraction P of the frames on every TX queue of every process (the job
file's `link: {loss: P}`), to compare with the loss-free mercury of the same trials (gloo
runs over the kernel's loopback, which has no loss to inject).
With --bf16, one more variant, mercury_bf16: the mercury job with every tensor bfloat16
(ps-worker --dtype bfloat16: half the bytes; every aggregate checked against the servers'
float32 arithmetic rounded once into bfloat16), beside float32 mercury of the same trials.
With --compare-build DIR, one more variant, mercury_b: the same mercury job run by the
build in DIR (another commit's binaries, this checkout's job files and models), in the same
random order as the rest of each trial: a change's before and after, interleaved.
With --checkpoint-every-s S, one more variant, mercury_ckpt: the mercury job with the
servers' background checkpoints on (`checkpoint: {dir: <a temporary directory>, every_s:
S}`, docs/durability.md), in the same random order: its cost beside the job without them.
Then every mercury variant's figure is the mean iteration time over the `iters`
iterations (a checkpoint costs the few iterations around it, which a median would hide):
run enough iterations to span several checkpoint intervals.
With --standby (root: network namespaces), two more variants: mercury_bridge, the mercury
job with every node a process in a network namespace of its own on a Linux bridge
(net_af_packet, one port per node, MTU 1500: the veths' frames), and mercury_standby, the
same with a hot standby of
the server (`standby:`, docs/durability.md: every update replicated to it before it goes
to the workers). A standby needs a port every node reaches, which a memif link is not, so
its cost is the ratio of the two bridge variants of the same trial.
An iteration's time is the slowest rank's (from the barrier to its last completion); a
trial's figure is the median over `iters` iterations after `warmup`. The table gives, per
variant, the median [min, max] over the trials and the ratio to gloo_fused taken per
trial, and whether every result was exact (like nccl-tests' correctness column).

Debian's python3-torch must be installed (`make bench` installs it); run with
/usr/bin/python3.
"""
import argparse
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))


def memif_job(workers, name, loss=0.0, training="{sync: bsp, optimizer: sum}", network="",
              link="", checkpoint=""):
    """A job file like config/memif.yaml (MTU 9000) with `workers` workers and the `training`
    section given (default bsp, optimizer sum); with `loss`, the link emulator drops that
    fraction of the frames; `network` and `link` add keys to those sections (e.g.
    "scheduler: fifo", "rate_gbps: 2"); `checkpoint` is the checkpoint section's keys.
    benchmarks/sync and benchmarks/eval use it too."""
    links = (["loss: %g, seed: 3" % loss] if loss > 0 else []) + ([link] if link else [])
    y = ["job: {id: 12, name: %s}" % name,
         "network: {mtu: 9000, peer_timeout_ms: 5000%s}" % (", " + network if network else ""),
         "mempool: {mbufs: 8191, cache: 256}",
         "eal: {memory_mb: 1024, hugepages: auto}",
         "training: %s" % training]
    if links:
        y.append("link: {%s}" % ", ".join(links))
    if checkpoint:
        y.append("checkpoint: {%s}" % checkpoint)
    y += ["nodes:",
          "  - name: server0",
          "    role: server",
          "    ipv4: 10.0.0.1",
          "    mac: 02:00:00:00:00:01",
          "    ports:"]
    for w in range(workers):
        y.append("      - net_memif%d,role=server,id=0,socket=/tmp/mercury-peers/%s-w%d.sock,"
                 "bsize=9216"
                 % (w, name, w))
    # config/memif.yaml's layout: the server on the even lcores (alone on CPU 0 of a 2-CPU
    # machine, its shards inline), the workers on the odd ones.
    y += ["    lcores: [0, 2, 4]", "    shards: 2"]
    for w in range(workers):
        y += ["  - name: w%d" % w,
              "    role: worker",
              "    ipv4: 10.0.0.%d" % (11 + w),
              "    mac: 02:00:00:00:00:%02x" % (0x11 + w),
              "    ports: [ \"net_memif1%d,role=client,id=0,socket=/tmp/mercury-peers/%s-w%d.sock,"
              "bsize=9216\" ]"
              % (w, name, w),
              "    lcores: [%d]" % (1 + 2 * w)]
    return "\n".join(y) + "\n"


def bridge_job(workers, name, standby, training="{sync: bsp, optimizer: sum}"):
    """The job over net_af_packet on a bridge (docs/durability.md: a standby's port reaches
    every node): server0 with one shard on its net core, with `standby` a standby
    server0b, `workers` workers; node i's port is eth0 of its namespace.
    benchmarks/peers/failover_bench.py uses it too."""
    # Both variants run the shard inline on the server's net core: a standby pair must, and
    # lcore 2 shares CPU 0 with the net core on a 2-CPU machine (config/memif.yaml).
    nodes = [("server0", "server", 1, ", shards: 1" + (", standby: server0b" if standby else ""))]
    if standby:
        nodes.append(("server0b", "standby", 2, ""))
    nodes += [("w%d" % w, "worker", 11 + w, "") for w in range(workers)]
    y = ["job: {id: 13, name: %s}" % name,
         # The veths of pmd-tests/common/netns.py carry 1500-byte frames.
         "network: {mtu: 1500, peer_timeout_ms: 1500}",
         "mempool: {mbufs: 8191, cache: 256}",
         "eal: {memory_mb: 512, hugepages: auto}",
         "training: %s" % training,
         "nodes:"]
    # config/memif.yaml's layout: the server (and its standby) on even lcores, CPU 0 of a
    # 2-CPU machine, the workers on odd ones, CPU 1.
    for i, (node, role, host, extra) in enumerate(nodes):
        if role == "server":
            lcores = "[0]" if standby else "[0, 2]"
        elif role == "standby":
            lcores = "[2]"
        else:
            lcores = "[%d]" % (1 + 2 * (i - (2 if standby else 1)))
        y.append("  - {name: %s, role: %s, ipv4: 10.80.0.%d, "
                 "ports: [\"net_af_packet%d,iface=eth0\"], lcores: %s%s}"
                 % (node, role, host, i, lcores, extra))
    return "\n".join(y) + "\n", [n for n, _, _, _ in nodes]


def mercury_bridge(build, model, workers, iters, warmup, standby):
    """The bridge job's figure (mean iteration, exact, retransmissions, refusals), with or
    without a standby; every process in its network namespace (needs root)."""
    sys.path.insert(0, os.path.join(ROOT, "pmd-tests", "common"))
    from netns import bridge_namespaces, end
    tag = "pb%d" % (os.getpid() % 100000)
    text, names = bridge_job(workers, "bridge%d" % workers, standby)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
        job = f.name
    ns = {}
    procs = []
    try:
        ns.update(bridge_namespaces(tag, names))
        for node in names:
            worker = node.startswith("w")
            argv = ([os.path.join(build, "apps/ps-worker/ps-worker"), "--model", model,
                     "--rounds", str(warmup + iters), "--verify", "last"] if worker
                    else [os.path.join(build, "apps/ps-server")])
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns[node]] + argv + ["--config", job, "--node", node],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT))
        outs = [p.communicate(timeout=1800)[0] for p in procs]
    finally:
        end(procs, ns)
        os.unlink(job)
    out = "\n".join(outs)
    rounds = {}
    for rank, rnd, secs in re.findall(r"w(\d+) round +(\d+): +([\d.]+) s", out):
        rounds.setdefault(int(rnd), []).append(float(secs))
    times = [max(v) for k, v in sorted(rounds.items()) if k > warmup and len(v) == workers]
    exact = (all(p.returncode == 0 for p in procs) and "MISMATCH" not in out and
             out.count("the last round's aggregate exact") == workers)
    if len(times) != iters:
        sys.exit("peers_bench: the bridge job failed:\n" + out[-6000:])
    if standby:
        line = re.search(r"standby: \d+ chunk versions replicated \((\d+) bytes, (\d+) per", out)
        print("  mercury_standby: %s" % (line.group(0) if line else "no standby line"), flush=True)
    resent = sum(int(x) for x in re.findall(r"stopped; \d+ aggregations, (\d+) retrans", out))
    refused = sum(int(x) for x in re.findall(r"backpressure=(\d+)", out))
    return statistics.mean(times), exact, resent, refused


# Every checkpoint the mercury_ckpt runs wrote: (seconds to write it, its writer's CPU seconds).
CHECKPOINTS = []


def mercury(build, model, workers, iters, warmup, loss=0.0, dtype="float32", checkpoint_s=0.0,
            mean=False):
    ckpt = tempfile.mkdtemp(prefix="mercury-peers-ckpt-") if checkpoint_s > 0 else ""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(memif_job(workers, "peers%d" % workers, loss,
                          checkpoint="dir: %s, every_s: %g" % (ckpt, checkpoint_s) if ckpt
                          else ""))
        job = f.name
    try:
        r = subprocess.run(
            [os.path.join(build, "apps/ps-demo"), "--config", job, "--model", model,
             "--rounds", str(warmup + iters), "--verify", "last"] +
            (["--dtype", dtype] if dtype != "float32" else []),
            capture_output=True, text=True, timeout=1800, cwd=ROOT)
    finally:
        os.unlink(job)
        if ckpt:
            subprocess.run(["rm", "-rf", ckpt])
    rounds = {}
    for rank, rnd, secs in re.findall(r"\] w(\d+) round +(\d+): +([\d.]+) s", r.stdout):
        rounds.setdefault(int(rnd), []).append(float(secs))
    exact = (r.returncode == 0 and "the last round's aggregate exact" in r.stdout and
             "MISMATCH" not in r.stdout)
    if ckpt:
        # The servers' count: checkpoints written, and none failed.
        written = re.search(r"checkpoints: (\d+) written .* (\d+) failed", r.stdout)
        exact = exact and written is not None and written.group(2) == "0"
        print("  mercury_ckpt: %s" % (written.group(0) if written else "no checkpoint line"),
              flush=True)
        for wall, cpu in re.findall(r"checkpoint at version \d+ written: .*, ([\d.]+) s, "
                                    r"([\d.]+) s of CPU\)", r.stdout):
            CHECKPOINTS.append((float(wall), float(cpu)))
    times = [max(v) for k, v in sorted(rounds.items()) if k > warmup and len(v) == workers]
    if len(times) != iters:
        sys.exit("peers_bench: the Mercury job failed:\n" + r.stdout[-4000:] + r.stderr[-2000:])
    # Loss-free runs should resend and refuse nothing: the server's last line
    # counts its retransmissions and its drops by reason (backpressure=...).
    stopped = re.search(r"stopped; \d+ aggregations, (\d+) retransmissions(?: \([^)]*\))?, "
                        r"drops:(.*)", r.stdout)
    resent = int(stopped.group(1)) if stopped else -1
    refused = re.search(r"backpressure=(\d+)", stopped.group(2)) if stopped else None
    worker_resent = sum(int(x) for x in re.findall(r"round +%d: .* retransmissions (\d+)" %
                                                    (warmup + iters), r.stdout))
    return (statistics.mean(times) if mean else statistics.median(times), exact,
            resent + worker_resent,
            int(refused.group(1)) if refused else 0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gloo(model, workers, mode, iters, warmup):
    port = free_port()
    procs = [subprocess.Popen(
        ["/usr/bin/python3", os.path.join(HERE, "gloo_rank.py"), "--rank", str(r), "--world",
         str(workers), "--port", str(port), "--model", model, "--mode", mode, "--iters",
         str(iters), "--warmup", str(warmup)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        for r in range(workers)]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        if p.returncode != 0:
            sys.exit("peers_bench: a gloo rank failed")
        results.append(json.loads(out.strip().splitlines()[-1]))
    per_iter = [max(r["times"][i] for r in results) for i in range(iters)]
    return statistics.median(per_iter), all(r["exact"] for r in results), 0, 0


def tcp_ps(model, workers, iters, warmup):
    port = free_port()
    common = ["--world", str(workers), "--port", str(port), "--model", model, "--iters",
              str(iters), "--warmup", str(warmup)]
    script = os.path.join(HERE, "tcp_ps.py")
    server = subprocess.Popen(["/usr/bin/python3", script, "server"] + common, cwd=ROOT)
    procs = [subprocess.Popen(["/usr/bin/python3", script, "worker", "--rank", str(r)] + common,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
             for r in range(workers)]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        if p.returncode != 0:
            server.kill()
            sys.exit("peers_bench: a tcp_ps worker failed")
        results.append(json.loads(out.strip().splitlines()[-1]))
    if server.wait(timeout=60) != 0:
        sys.exit("peers_bench: the tcp_ps server failed")
    per_iter = [max(r["times"][i] for r in results) for i in range(iters)]
    return statistics.median(per_iter), all(r["exact"] for r in results), 0, 0


def summary(xs):
    return "%.3f [%.3f, %.3f]" % (statistics.median(xs), min(xs), max(xs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--models", default="resnet50,vgg16")
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--csv", help="also write every trial's figures here")
    ap.add_argument("--loss", type=float, default=0.0,
                    help="also run mercury_loss: the mercury job at this frame loss rate")
    ap.add_argument("--compare-build", default="",
                    help="also run mercury_b: the mercury job with this build's binaries")
    ap.add_argument("--bf16", action="store_true",
                    help="also run mercury_bf16: the mercury job with bfloat16 tensors")
    ap.add_argument("--checkpoint-every-s", type=float, default=0.0,
                    help="also run mercury_ckpt: the mercury job with a checkpoint every S s "
                         "(mercury variants then report the mean iteration)")
    ap.add_argument("--standby", action="store_true",
                    help="also run mercury_bridge and mercury_standby: the job over "
                         "net_af_packet on a bridge without and with a hot standby (root)")
    ap.add_argument("--only", default="",
                    help="run only these variants (comma-separated names from the list the "
                         "other options make; without gloo_fused the ratio column is empty)")
    a = ap.parse_args()
    try:
        import torch  # noqa: F401  (only to fail early with a clear message)
    except ImportError:
        sys.exit("peers_bench: needs Debian's python3-torch, run with /usr/bin/python3")
    variants = (["mercury", "tcp_ps", "gloo", "gloo_fused"] +
                (["mercury_loss"] if a.loss > 0 else []) +
                (["mercury_b"] if a.compare_build else []) +
                (["mercury_bf16"] if a.bf16 else []) +
                (["mercury_ckpt"] if a.checkpoint_every_s > 0 else []) +
                (["mercury_bridge", "mercury_standby"] if a.standby else []))
    if a.only:
        only = a.only.split(",")
        unknown = [v for v in only if v not in variants]
        if unknown:
            sys.exit("peers_bench: --only names %s, not among the variants these options run "
                     "(%s)" % (",".join(unknown), ",".join(variants)))
        variants = [v for v in variants if v in only]
    rows = []
    for m in a.models.split(","):
        model = os.path.join(ROOT, "config/models", m + ".txt")
        for n in [int(x) for x in a.workers.split(",")]:
            got = {v: [] for v in variants}
            for t in range(a.trials):
                order = variants[:]
                random.shuffle(order)
                trial = {}
                for v in order:
                    if v in ("mercury_bridge", "mercury_standby"):
                        trial[v] = mercury_bridge(a.build, model, n, a.iters, a.warmup,
                                                  v == "mercury_standby")
                    elif v.startswith("mercury"):
                        trial[v] = mercury(a.compare_build if v == "mercury_b" else a.build,
                                           model, n, a.iters, a.warmup,
                                           a.loss if v == "mercury_loss" else 0.0,
                                           "bfloat16" if v == "mercury_bf16" else "float32",
                                           a.checkpoint_every_s if v == "mercury_ckpt" else 0.0,
                                           mean=a.checkpoint_every_s > 0)
                    elif v == "tcp_ps":
                        trial[v] = tcp_ps(model, n, a.iters, a.warmup)
                    else:
                        mode = "fused" if v == "gloo_fused" else "per_tensor"
                        trial[v] = gloo(model, n, mode, a.iters, a.warmup)
                    print("%s %d workers trial %d %-10s %.3f s/iter %s" %
                          (m, n, t + 1, v, trial[v][0], "exact" if trial[v][1] else "WRONG"),
                          flush=True)
                for v in variants:
                    got[v].append(trial[v] + (trial[v][0] / trial["gloo_fused"][0]
                                              if "gloo_fused" in trial else float("nan"),))
            rows.append((m, n, got))
    print("\n| model | workers | variant | s/iteration, median [min, max] | "
          "ratio to gloo fused | correct | retransmissions, max | refusals, max |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for m, n, got in rows:
        for v in variants:
            xs = got[v]
            print("| %s | %d | %s | %s | %s | %s | %d | %d |" % (
                m, n, v, summary([x[0] for x in xs]), summary([x[4] for x in xs]),
                "yes" if all(x[1] for x in xs) else "NO", max(x[2] for x in xs),
                max(x[3] for x in xs)))
    if a.standby:
        # The standby's cost: per trial, its job's time over the same job's without it.
        for m, n, got in rows:
            ratios = [x[0] / y[0] for x, y in zip(got["mercury_standby"], got["mercury_bridge"])]
            print("%s %d workers: mercury_standby / mercury_bridge %s (goal <= 1.3)" %
                  (m, n, summary(ratios)))
    if a.checkpoint_every_s > 0 and "mercury" in variants and "mercury_ckpt" in variants:
        # The checkpoints' cost: per trial, the job's mean iteration with them over without.
        for m, n, got in rows:
            ratios = [x[0] / y[0] for x, y in zip(got["mercury_ckpt"], got["mercury"])]
            print("%s %d workers: mercury_ckpt / mercury %s (a checkpoint every %g s; "
                  "goal <= 1.05 at one a minute)" % (m, n, summary(ratios),
                                                     a.checkpoint_every_s))
        if CHECKPOINTS:
            # What one checkpoint costs whatever the noise between runs: its writer
            # thread's CPU time (the shards' copies into their snapshots are not in it).
            cpu = [c for _, c in CHECKPOINTS]
            print("checkpoints: %d, each written in %s s, its writer's CPU %s s = %s of one "
                  "CPU at one every %g s" % (
                      len(CHECKPOINTS), summary([w for w, _ in CHECKPOINTS]), summary(cpu),
                      summary([c / a.checkpoint_every_s for c in cpu]), a.checkpoint_every_s))
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("model,workers,variant,trial,seconds,exact,retransmissions,refusals,"
                    "ratio_to_gloo_fused\n")
            for m, n, got in rows:
                for v in variants:
                    for i, x in enumerate(got[v]):
                        f.write("%s,%d,%s,%d,%.6f,%d,%d,%d,%.4f\n" %
                                (m, n, v, i + 1, x[0], x[1], x[2], x[3], x[4]))


if __name__ == "__main__":
    main()
