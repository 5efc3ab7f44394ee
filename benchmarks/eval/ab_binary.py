#!/usr/bin/python3
"""Builds of one program side by side on one evaluation run: the wall time of a
trace-driven job (eval.py's sched_run: ps-demo, one ps-server and four ps-workers on the
emulated link) and its iteration time, with the program at PATH (under BUILD_DIR) swapped
between the binaries before each run, interleaved, TRIALS rounds of all of them; medians
and spread per binary. The partitioned variants run at the job's default partition. The
binary at PATH is left as the last one given.

  ab_binary.py BUILD_DIR PATH BINARY BINARY... [--model vgg16] [--link 10] [--variant strict]
               [--sync bsp] [--trials 5]

Under another --sync than bsp the run is one of the evaluation's modes table
(sync_model_run: 10 Gbit/s, strict priority, rank 3 a 4x straggler; --link and --variant
do not apply) and the iteration is rank 0's mean over its rounds (as the table's).

e.g. ab_binary.py build apps/ps-worker/ps-worker /tmp/ps-worker.old /tmp/ps-worker.new
(each binary is labelled by its file name).
"""
import argparse
import os
import shutil
import statistics
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eval as ev  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("path", help="the program, relative to BUILD_DIR")
    p.add_argument("binaries", nargs="+")
    p.add_argument("--model", default="vgg16", choices=ev.MODELS)
    p.add_argument("--link", type=int, default=10, choices=sorted(ev.LINKS))
    p.add_argument("--variant", default="strict", choices=ev.VARIANTS)
    p.add_argument("--sync", default="bsp", choices=ev.MODES)
    p.add_argument("--trials", type=int, default=5)
    a = p.parse_args()
    if a.trials < 1:
        p.error("--trials must be positive")
    if len(a.binaries) < 2 or len(set(map(os.path.basename, a.binaries))) != len(a.binaries):
        p.error("give at least two binaries, with distinct file names")
    for f in a.binaries:
        if not os.access(f, os.X_OK):
            p.error(f"{f}: not an executable")
    dst = os.path.join(a.build, a.path)
    if not os.path.isfile(dst):
        p.error(f"{dst}: no such program in the build")
    st = ev.Settings(False, a.trials)
    runner = types.SimpleNamespace(build=os.path.abspath(a.build))
    got = {os.path.basename(b): [] for b in a.binaries}
    try:
        for trial in range(a.trials):
            for binary in a.binaries:
                label = os.path.basename(binary)
                shutil.copy(binary, dst)
                t = time.monotonic()
                if a.sync == "bsp":
                    it = ev.sched_run(runner, st, a.link, a.model, a.variant, None)["iteration_s"]
                else:
                    it = ev.sync_model_run(runner, st, a.model, a.sync)["iteration_mean_s"]
                wall = time.monotonic() - t
                got[label].append((wall, it))
                print(f"{label} trial {trial + 1}: wall {wall:.1f} s, iteration {it:.3f} s",
                      flush=True)
    finally:
        shutil.copy(a.binaries[-1], dst)
    for label, runs in got.items():
        walls = [w for w, _ in runs]
        its = [i for _, i in runs]
        print(f"{label}: wall {statistics.median(walls):.1f} s [{min(walls):.1f}, "
              f"{max(walls):.1f}], iteration {statistics.median(its):.3f} s "
              f"[{min(its):.3f}, {max(its):.3f}] (median [min, max] of {len(runs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
