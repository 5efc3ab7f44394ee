#!/usr/bin/python3
"""Half-precision tensors end to end, in processes: ps-server and three `ps-worker --dtype`
processes over net_memif, the link emulator losing 2 % of the frames (and reordering and
duplicating 1 %) on every TX queue. For each of bfloat16, float16 and mixed (the tensors
float32, bfloat16 and float16 in turn, in one job) every worker must report rank 0's
initial parameters exact and every round's aggregate exact: its 16-bit buffers bit for bit
the servers' float32 master parameters, replayed from every rank's rounded gradients (summed
in rank order, momentum), rounded once to nearest even. The model has tensors of odd length
(a last packet of 2-byte elements not a multiple of 4 bytes), tensors of one packet and of
many, on two shards. The loss is real: every worker must have retransmitted.
Also: ps-worker refuses --dtype with --trace, saying why.

`c`: the C ABI's typed calls, two half_trainer.c processes (bfloat16, float16 and float32
tensors, each rank checking every round's aggregate and the refusals of a wrong dtype)
with ps-server, over the same lossy links.

  half_job_test.py PS_SERVER ps-worker PS_WORKER
  half_job_test.py PS_SERVER c HALF_TRAINER
"""
import os
import re
import subprocess
import sys
import tempfile

ROUNDS = 5
WORKERS = 3
LINK = "link: {loss: 0.02, reorder: 0.01, duplicate: 0.01, seed: 11}"
# name, elements: odd sizes, one chunk and less, several chunks, several blocks.
MODEL = [("conv1.weight", 1727), ("conv1.bias", 33), ("fc.weight", 250001), ("fc.bias", 7),
         ("head.weight", 40960), ("head.bias", 1)]


def job_text(tag, workers=WORKERS,
             training="optimizer: momentum, learning_rate: 0.0625, momentum: 0.875"):
    y = ["job: {id: 42, name: %s}" % tag,
         "network: {mtu: 1500, peer_timeout_ms: 20000}",
         "mempool: {mbufs: 8191, cache: 128}",
         "eal: {memory_mb: 256, hugepages: off}",
         "training: {sync: bsp, %s}" % training,
         LINK, "nodes:",
         "  - name: server0", "    role: server", "    ipv4: 10.0.0.1",
         "    mac: 02:00:00:00:00:01", "    ports:"]
    for w in range(workers):
        y.append("      - net_memif%d,role=server,id=0,socket=/tmp/%s-w%d.sock" % (w, tag, w))
    y += ["    lcores: [0, 2, 4]", "    shards: 2"]
    for w in range(workers):
        y += ["  - name: w%d" % w, "    role: worker", "    ipv4: 10.0.0.%d" % (11 + w),
              "    mac: 02:00:00:00:00:%02x" % (0x11 + w),
              "    ports: [\"net_memif1%d,role=client,id=0,socket=/tmp/%s-w%d.sock\"]" % (w, tag, w),
              "    lcores: [%d]" % (1 + 2 * w)]
    return "\n".join(y) + "\n"


def run_processes(ps_server, job, worker_argvs, what, check, timeout):
    """ps-server on `job` and one process per argv; check(rank, output) returns the
    problems with a worker's output. Returns every problem, named with `what`."""
    server = subprocess.Popen([ps_server, "--config", job, "--seconds", str(timeout)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for argv in worker_argvs]
    errors = []
    for r, p in enumerate(procs + [server]):
        name = "ps-server" if p is server else "w%d" % r
        try:
            out, _ = p.communicate(timeout=60 if p is server else timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            errors.append("%s %s did not end" % (what, name))
        print(out if p is not server else out[-1500:], end="")
        if p.returncode != 0:
            errors.append("%s %s: exit %d" % (what, name, p.returncode))
        if p is not server:
            errors += ["%s %s: %s" % (what, name, e) for e in check(r, out)]
    return errors


def check_ps_worker(_rank, out):
    """A ps-worker's output: version 0 and every round exact, and the loss was real."""
    problems = []
    exact = len(re.findall(r"round +\d+: .* every aggregate exact", out))
    if "initial parameters exact" not in out or exact != ROUNDS:
        problems.append("%d of %d rounds exact" % (exact, ROUNDS))
    retransmits = [int(x) for x in re.findall(r"retransmissions (\d+)", out)]
    if not retransmits or retransmits[-1] == 0:
        problems.append("no retransmission at 2 % loss")
    return problems


def check_c(_rank, out):
    exact = len(re.findall(r"round \d+: bfloat16, float16, float32 exact", out))
    if exact != ROUNDS or "the typed C calls exact" not in out:
        return ["%d of %d rounds exact" % (exact, ROUNDS)]
    return []


def run_job(ps_server, ps_worker, tmp, dtype):
    job = os.path.join(tmp, "%s.yaml" % dtype)
    with open(job, "w") as f:
        f.write(job_text("mercury-half-%s-%d" % (dtype, os.getpid())))
    model = os.path.join(tmp, "model.txt")
    return run_processes(ps_server, job, [
        [ps_worker, "--config", job, "--node", "w%d" % r, "--model", model, "--rounds",
         str(ROUNDS), "--dtype", dtype] for r in range(WORKERS)], dtype, check_ps_worker, 240)


def run_c(ps_server, trainer, tmp):
    """Two C trainers of the typed calls, optimizer sum: each checks itself."""
    job = os.path.join(tmp, "c.yaml")
    with open(job, "w") as f:
        f.write(job_text("mercury-half-c-%d" % os.getpid(), 2, "optimizer: sum"))
    return run_processes(ps_server, job, [[trainer, job, "w%d" % r, str(ROUNDS)]
                                          for r in range(2)], "c", check_c, 120)


def main():
    ps_server, mode, program = sys.argv[1:4]
    if mode == "c":
        with tempfile.TemporaryDirectory(prefix="half-c-") as tmp:
            errors = run_c(ps_server, program, tmp)
        for e in errors:
            print("FAIL:", e)
        return 1 if errors else 0
    ps_worker = program
    errors = []
    with tempfile.TemporaryDirectory(prefix="half-job-") as tmp:
        with open(os.path.join(tmp, "model.txt"), "w") as f:
            f.write("# half_job_test's model\n")
            for name, n in MODEL:
                f.write("%s %d %d\n" % (name, n, n))
        for dtype in ("bfloat16", "float16", "mixed"):
            errors += run_job(ps_server, ps_worker, tmp, dtype)
        # The trace-driven trainer checks float32 only: refused, naming the option.
        job = os.path.join(tmp, "trace.yaml")
        with open(job, "w") as f:
            f.write(job_text("mercury-half-trace-%d" % os.getpid()))
        r = subprocess.run([ps_worker, "--config", job, "--node", "w0", "--model",
                            os.path.join(tmp, "model.txt"), "--dtype", "bfloat16",
                            "--trace", os.path.join(tmp, "model.txt")],
                           capture_output=True, text=True, timeout=60)
        if r.returncode == 0 or "--dtype bfloat16 goes with the synthetic and free-running " \
                "rounds, not --trace" not in r.stderr:
            errors.append("--dtype with --trace not refused: %d %s" % (r.returncode, r.stderr))
    for e in errors:
        print("FAIL:", e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
