#!/usr/bin/python3
"""What mercury.torch's update="at_step" costs on a model's tensor set, through the
Python worker: ps-server and N worker processes on a memif job like the peers
benchmark's (BSP, the servers' SGD), each tensor of the model file declared three times:
once under the optimizer's rule (the default, per-chunk update), and as the at_step pair
(an "average" tensor and an "optimizer_rank0" one). A round of each variant:

  per_chunk  push_pull of every tensor, last layer first, then wait for all: what the
             default mode puts on the wire in a step.
  at_step    push_pull of every tensor's average, wait for all (the step's average in
             .grad), then push_pull of every tensor's final gradient to the optimizer_rank0
             tensors, wait for all: the same step in two round trips.

Each round starts with a barrier; the variants alternate in an order drawn per pair of
rounds from one seed (the same on every rank). A trial's figure per variant is the median
round time of rank 0 after the warm-up; the table gives the median [min, max] over the
trials and the per-trial ratio at_step / per_chunk.

  benchmarks/peers/at_step_bench.py [--build build] [--model resnet50] [--workers 2]
                                    [--trials 5] [--iters 10] [--warmup 3]

Debian's python3-numpy and the build's mercury package; run with /usr/bin/python3.
"""
import argparse
import os
import random
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from model_file import read_model  # noqa: E402
from peers_bench import memif_job  # noqa: E402


def worker_main(node, rank, sizes, iters, warmup, out_dir):
    import numpy as np

    import mercury

    w = mercury.Worker(os.environ["MERCURY_JOB"], node)
    rng = np.random.default_rng(rank)
    tensors = []
    for i, n in enumerate(sizes):
        grad = rng.standard_normal(n, dtype=np.float32)
        keys = (w.declare(f"p{i}", np.zeros(n, np.float32), i),
                w.declare(f"a{i}", np.zeros(n, np.float32), i, update="average"),
                w.declare(f"s{i}", np.zeros(n, np.float32), i, update="optimizer_rank0"))
        tensors.append((keys, grad))
    w.start()
    order = list(reversed(tensors))  # the last layer first, as backward produces them

    def per_chunk():
        for h in [w.push_pull(k[0], g) for k, g in order]:
            h.wait()

    def at_step():
        for h in [w.push_pull(k[1], g) for k, g in order]:
            h.wait()
        for h in [w.push_pull(k[2], g) for k, g in order]:
            h.wait()

    variants = {"per_chunk": per_chunk, "at_step": at_step}
    times = {name: [] for name in variants}
    pick = random.Random(7)
    for _ in range(warmup + iters):
        names = list(variants)
        pick.shuffle(names)
        for name in names:
            w.barrier()
            t0 = time.monotonic()
            variants[name]()
            times[name].append(time.monotonic() - t0)
    w.barrier()
    w.shutdown()
    if rank == 0:
        with open(os.path.join(out_dir, "times"), "w") as f:
            for name, t in times.items():
                f.write(f"{name} {statistics.median(t[warmup:])}\n")
    return 0


def trial(build, sizes, workers, iters, warmup):
    from mercury.launch import run_job

    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(memif_job(workers, "atstep%d" % workers,
                              training="{sync: bsp, optimizer: sgd, learning_rate: 1.0e-9}"))
        lines = []
        status = run_job(job, server_bin=os.path.join(build, "apps", "ps-server"),
                         echo=lambda node, line: lines.append(f"{node}: {line}"),
                         timeout_s=1800,
                         worker_main=lambda node, rank: worker_main(node, rank, sizes, iters,
                                                                    warmup, tmp))
        if any(s != 0 for s in status.values()):
            sys.exit("at_step_bench: the job failed: %s\n%s" % (status, "\n".join(lines[-40:])))
        with open(os.path.join(tmp, "times")) as f:
            return {name: float(t) for name, t in (line.split() for line in f)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--model", default="resnet50")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    build = os.path.abspath(a.build)
    sys.path.insert(0, os.path.join(build, "lib", "python"))
    sizes = read_model(os.path.join(ROOT, "config", "models", a.model + ".txt"), "at_step_bench")
    got = {"per_chunk": [], "at_step": []}
    ratios = []
    for t in range(a.trials):
        r = trial(build, sizes, a.workers, a.iters, a.warmup)
        for name in got:
            got[name].append(r[name])
        ratios.append(r["at_step"] / r["per_chunk"])
        print(f"trial {t + 1}/{a.trials}: per_chunk {r['per_chunk']:.3f} s, at_step "
              f"{r['at_step']:.3f} s per round", flush=True)

    def spread(xs):
        return f"{statistics.median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"

    print(f"\n{a.model}, {len(sizes)} tensors, {sum(sizes)} elements, {a.workers} workers")
    for name, xs in got.items():
        print(f"{name:<10} {spread(xs)} s per round")
    print(f"at_step / per_chunk per trial: {spread(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
