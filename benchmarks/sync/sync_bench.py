#!/usr/bin/python3
"""The synchronisation modes side by side with a straggler (benchmarks/sync/README.md).

  benchmarks/sync/sync_bench.py [--build build] [--model resnet50] [--workers 4]
                                [--compute-ms 200] [--straggler 3] [--rounds 10]
                                [--trials 5] [--modes bsp,asp,ssp,psplus] [--bound 2]
                                [--csv FILE]

Each trial runs every mode once, in random order: ps-demo on a memif job like
config/memif.yaml (one ps-server, N ps-worker processes, MTU 9000, optimizer sgd with a
learning rate of 2^-4) with `training.sync` set to the mode (ssp with staleness_bound
--bound, psplus with its default learning-rate rule, lr / (1 + staleness)). Every worker
runs free-running rounds (ps-worker --compute-ms): it sleeps --compute-ms standing for
compute, then push_pulls every tensor of the model; the last rank computes --straggler
times longer. Per worker, the mean iteration time of its rounds after the first; the table
gives, per mode, the fast workers' mean and the straggler's, as the median [min, max] over
the trials, and each as a ratio to its own compute (its iteration's floor). bsp, asp and
ssp check their final parameters bit for bit (psplus's scaled steps are not order-free;
the trial reports what the workers say).
"""
import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "peers"))
from peers_bench import memif_job, summary  # noqa: E402  (the job file and the table's cells)


def run(a, model, mode):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        extra = {"ssp": "staleness_bound: %d, " % a.bound}.get(mode, "")
        f.write(memif_job(a.workers, "sync-" + mode, training="{sync: %s, %soptimizer: sgd, "
                          "learning_rate: 0.0625}" % (mode, extra)))
        job = f.name
    straggler = a.workers - 1
    try:
        r = subprocess.run(
            [os.path.join(a.build, "apps/ps-demo"), "--config", job, "--model", model,
             "--rounds", str(a.rounds), "--compute-ms", str(a.compute_ms),
             "--straggler", "%d,%g" % (straggler, a.straggler)],
            capture_output=True, text=True, timeout=3600, cwd=ROOT)
    finally:
        os.unlink(job)
    means = {}
    verdicts = {}
    for w, mean, verdict in re.findall(
            r"\] w(\d+): done, \d+ free-running rounds, mean iteration ([\d.]+) s .*?, "
            r"ssp waits \d+ \(gap max \d+\), (.*), drops: .*", r.stdout):
        means[int(w)] = float(mean)
        verdicts[int(w)] = verdict
    if r.returncode != 0 or len(means) != a.workers:
        sys.exit("sync_bench: the %s job failed:\n%s%s" % (mode, r.stdout[-4000:],
                                                            r.stderr[-2000:]))
    fast = statistics.mean(v for w, v in means.items() if w != straggler)
    gaps = [int(x) for x in re.findall(r"gap max (\d+)", r.stdout)]
    exact = all(v == "the final parameters exact" for v in verdicts.values())
    return fast, means[straggler], exact, max(gaps) if gaps else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--compute-ms", type=float, default=200)
    ap.add_argument("--straggler", type=float, default=3)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--modes", default="bsp,asp,ssp,psplus")
    ap.add_argument("--bound", type=int, default=2)
    ap.add_argument("--csv", help="also write every trial's figures here")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    model = os.path.join(ROOT, "config/models", a.model + ".txt")
    modes = a.modes.split(",")
    got = {m: [] for m in modes}
    for t in range(a.trials):
        order = modes[:]
        random.shuffle(order)
        for m in order:
            fast, slow, exact, gap = run(a, model, m)
            got[m].append((fast, slow, exact, gap))
            print("trial %d %-6s fast workers %.3f s/iter, straggler %.3f s/iter, %s%s" %
                  (t + 1, m, fast, slow, "exact" if exact else "not checked",
                   ", ssp gap max %d" % gap if m == "ssp" else ""), flush=True)
    compute = a.compute_ms / 1e3
    print("\n%s, %d workers (rank %d computes %gx longer), compute %.3f s, %d rounds, %d trials"
          % (a.model, a.workers, a.workers - 1, a.straggler, compute, a.rounds, a.trials))
    print("| mode | fast workers s/iter | / compute | straggler s/iter | / compute | checked |")
    print("| --- | --- | --- | --- | --- | --- |")
    for m in modes:
        fast = [x[0] for x in got[m]]
        slow = [x[1] for x in got[m]]
        print("| %s | %s | %.2f | %s | %.2f | %s |" %
              (m if m != "ssp" else "ssp (bound %d)" % a.bound, summary(fast),
               statistics.median(fast) / compute, summary(slow),
               statistics.median(slow) / (compute * a.straggler),
               "exact" if all(x[2] for x in got[m]) else "not order-free"))
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("mode,trial,fast_s,straggler_s,exact,ssp_gap\n")
            for m in modes:
                for i, x in enumerate(got[m]):
                    f.write("%s,%d,%.6f,%.6f,%d,%d\n" % (m, i + 1, x[0], x[1], x[2], x[3]))


if __name__ == "__main__":
    main()
