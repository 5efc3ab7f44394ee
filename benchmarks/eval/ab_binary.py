#!/usr/bin/python3
"""Two builds of one program side by side on one evaluation run: the wall time of a
trace-driven job (eval.py's sched_run: ps-demo, one ps-server and four ps-workers on the
emulated link) and its iteration time, with the program at PATH (under BUILD_DIR) swapped
between the two binaries before each run, the variants interleaved, TRIALS pairs; medians
and spread. The partitioned variants run at the job's default partition. The binary at
PATH is left as NEW.

  ab_binary.py BUILD_DIR PATH OLD NEW [--model vgg16] [--link 10] [--variant strict]
               [--trials 5]

e.g. ab_binary.py build apps/ps-worker/ps-worker /tmp/ps-worker.old /tmp/ps-worker.new
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
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--model", default="vgg16", choices=ev.MODELS)
    p.add_argument("--link", type=int, default=10, choices=sorted(ev.LINKS))
    p.add_argument("--variant", default="strict", choices=ev.VARIANTS)
    p.add_argument("--trials", type=int, default=5)
    a = p.parse_args()
    if a.trials < 1:
        p.error("--trials must be positive")
    for f in (a.old, a.new):
        if not os.access(f, os.X_OK):
            p.error(f"{f}: not an executable")
    dst = os.path.join(a.build, a.path)
    if not os.path.isfile(dst):
        p.error(f"{dst}: no such program in the build")
    st = ev.Settings(False, a.trials)
    runner = types.SimpleNamespace(build=os.path.abspath(a.build))
    got = {"old": [], "new": []}
    try:
        for trial in range(a.trials):
            for label, binary in (("old", a.old), ("new", a.new)):
                shutil.copy(binary, dst)
                t = time.monotonic()
                r = ev.sched_run(runner, st, a.link, a.model, a.variant, None)
                wall = time.monotonic() - t
                got[label].append((wall, r["iteration_s"]))
                print(f"{label} trial {trial + 1}: wall {wall:.1f} s, iteration "
                      f"{r['iteration_s']:.3f} s", flush=True)
    finally:
        shutil.copy(a.new, dst)
    for label, runs in got.items():
        walls = [w for w, _ in runs]
        its = [i for _, i in runs]
        print(f"{label}: wall {statistics.median(walls):.1f} s [{min(walls):.1f}, "
              f"{max(walls):.1f}], iteration {statistics.median(its):.3f} s "
              f"[{min(its):.3f}, {max(its):.3f}] (median [min, max] of {len(runs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
