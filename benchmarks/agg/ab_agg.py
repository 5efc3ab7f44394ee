#!/usr/bin/python3
"""Two builds of agg_bench side by side: each binary run in turn (A B A B ...), TRIALS
rounds, every run one repetition of the benchmarks FILTER selects; per binary, the median
and [min, max] over the rounds of each variant's ratio to its limit in the same run (the
ratio RatioReporter prints), then B's ratio over A's within each round (the pair closest
in time), median and [min, max]. A change to lib/agg is judged by these ratios, never by
figures taken at different times.

  ab_agg.py BINARY_A BINARY_B [--filter 'agg/(limit_sum|sgd)/all'] [--trials 7]

e.g. ab_agg.py /tmp/main/build/benchmarks/agg/agg_bench build/benchmarks/agg/agg_bench
(the binaries are labelled by their paths).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROW = re.compile(r"^(\S+)\s+(\S+)\s+(\S+)\s+\S+\s+\[\s*\S+,\s*\S+\]\s+([0-9.]+)\s+\[")


def ratios(binary: str, pattern: str) -> dict:
    """One run: {(group, arg, variant): ratio to the group's limit}."""
    out = subprocess.run([binary, f"--benchmark_filter={pattern}", "--benchmark_repetitions=1"],
                         check=True, capture_output=True, text=True).stdout
    got = {}
    table = out[out.rfind("\ngroup "):] if "\ngroup " in out else ""
    for line in table.splitlines()[1:]:
        m = ROW.match(line)
        if m:
            got[(m.group(1), m.group(2), m.group(3))] = float(m.group(4))
    return got


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("binaries", nargs=2)
    p.add_argument("--filter", default="agg/(limit_sum|sgd)/all")
    p.add_argument("--trials", type=int, default=7)
    a = p.parse_args()
    if a.trials < 1:
        p.error("--trials must be positive")
    for b in a.binaries:
        if not os.access(b, os.X_OK):
            p.error(f"{b}: not an executable")
    runs = {b: [] for b in a.binaries}
    for trial in range(a.trials):
        for b in a.binaries:
            runs[b].append(ratios(b, a.filter))
        print(f"round {trial + 1}/{a.trials}", file=sys.stderr, flush=True)
    keys = sorted(set().union(*(r.keys() for rs in runs.values() for r in rs)))
    if not keys:
        print("no ratio found: does the filter select a limit and a variant?", file=sys.stderr)
        return 1
    def cell(v):
        return (f"{statistics.median(v):8.3f} [{min(v):.3f}, {max(v):.3f}] n={len(v)}"
                if v else "-")

    first, second = a.binaries
    print(f"{'group/arg/variant':36} {'binary 1':>26} {'binary 2':>26} {'2 over 1, per round':>26}")
    for k in keys:
        paired = [r2[k] / r1[k] for r1, r2 in zip(runs[first], runs[second])
                  if k in r1 and k in r2 and r1[k] > 0]
        cells = [cell([r[k] for r in runs[b] if k in r]) for b in a.binaries] + [cell(paired)]
        print(f"{'/'.join(k):36} " + " ".join(f"{c:>26}" for c in cells))
    print(f"binary 1: {first}\nbinary 2: {second}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
