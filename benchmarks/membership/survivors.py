#!/usr/bin/python3
"""The time the surviving workers lose to a worker's death (docs/membership.md).

The digits job of pmd-tests/python/membership_test.py: 4 worker processes and
ps-server over net_memif, rank 2 killed (SIGKILL) right after the backward pass of
its step 30. Modes are interleaved, run by run. Per run and mode it reports:

* lost: the longest step any survivor took from the kill on, less that survivor's
  median step before the kill, as a ratio to the peer timeout
  (network.peer_timeout_ms: 1.5 s, the limit the goal is stated against);
* after/before: the survivors' median step after the lost one against their median
  step before the kill (1.0: the job goes on at its old pace once the rank is gone).

Prints the median and [min, max] over the runs per mode.

  /usr/bin/python3 benchmarks/membership/survivors.py BUILD_DIR [--runs 5] [MODE ...]
"""
import argparse
import os
import statistics
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "pmd-tests", "python"))
import digits_test  # noqa: E402
import membership_test as mt  # noqa: E402


TIMEOUT_MS = 1500  # network.peer_timeout_ms's default


def measure(losses):
    lost, before_all, after_all = 0.0, [], []
    for r in range(4):
        if r == mt.KILLED:
            continue
        before, after = mt.steps_around_kill(losses, r)
        worst = int(np.argmax(after))
        lost = max(lost, float(after[worst]) - float(np.median(before)))
        before_all += list(before)
        after_all += list(np.delete(after, worst))
    return lost, float(np.median(after_all)) / float(np.median(before_all))


def spread(xs):
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("build")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("modes", nargs="*", default=list(mt.MODES))
    a = p.parse_args()
    mt.BUILD = digits_test.BUILD = os.path.abspath(a.build)
    results = {m: ([], []) for m in a.modes}
    failed = {m: 0 for m in a.modes}
    for run in range(a.runs):
        for mode in a.modes:
            with tempfile.TemporaryDirectory() as tmp:
                rc, out, losses = mt.run(tmp, mode, timeout_ms=TIMEOUT_MS)
                if rc != 0:
                    failed[mode] += 1
                    print(f"run {run} {mode}: failed\n{out}", file=sys.stderr)
                    continue
                lost, pace = measure(losses)
            results[mode][0].append(lost / (TIMEOUT_MS / 1000))
            results[mode][1].append(pace)
            print(f"run {run} {mode}: lost {lost:.3f} s, after/before {pace:.3f}", flush=True)
    print(f"\nlost / peer timeout ({TIMEOUT_MS} ms), and the survivors' median step after "
          "the kill / before it; median [min, max] over the runs")
    for mode, (lost, pace) in results.items():
        if lost:
            print(f"{mode:7s} lost/timeout {spread(lost)}  after/before {spread(pace)}  "
                  f"({len(lost)} runs, {failed[mode]} failed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
