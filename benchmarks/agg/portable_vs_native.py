#!/usr/bin/python3
"""The portable build's aggregation kernels against the native build's, side by side.

A portable build (meson setup -Dnative=false: DPDK's baseline, the kernels chosen at
run time) and a native one (-march=native) each build agg_bench; this runs the two
binaries interleaved, the first of each pair alternating (N P, P N, N P, ...), and
prints for every agg_bench kernel the GB/s of gradient consumed (CPU time) of each,
median [min, max] over the repeats, and portable / native per adjacent pair, median
[min, max]. The goal (docs/cluster.md, "Install") is a median ratio of at least 0.95
on every kernel.

    meson setup build-portable -Dnative=false && ninja -C build-portable benchmarks/agg/agg_bench
    benchmarks/agg/portable_vs_native.py build/benchmarks/agg/agg_bench \\
        build-portable/benchmarks/agg/agg_bench --repeats 5
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(binary, extra):
    """One run of agg_bench: {benchmark name: GB/s}."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([binary, f"--benchmark_out={out.name}", "--benchmark_out_format=json",
                        *extra], check=True, stdout=subprocess.DEVNULL)
        with open(out.name) as f:
            data = json.load(f)
    return {b["name"]: b["GBps"] for b in data["benchmarks"] if "GBps" in b}


def spread(values):
    return f"{statistics.median(values):7.2f} [{min(values):6.2f}, {max(values):6.2f}]"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("native")
    p.add_argument("portable")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--filter", default="", help="--benchmark_filter for agg_bench")
    a = p.parse_args()
    if a.repeats < 1:
        p.error("--repeats must be at least 1")
    extra = [f"--benchmark_filter={a.filter}"] if a.filter else []
    native, portable = [], []
    for i in range(a.repeats):
        order = [("native", a.native), ("portable", a.portable)]
        if i % 2:
            order.reverse()
        for name, binary in order:
            print(f"run {i + 1}/{a.repeats}: {name}", file=sys.stderr, flush=True)
            (native if name == "native" else portable).append(run(binary, extra))
    names = [n for n in native[0] if all(n in r for r in native + portable)]
    print(f"agg_bench, native ({os.path.relpath(a.native)}) and portable "
          f"({os.path.relpath(a.portable)}) interleaved, {a.repeats} runs each; GB/s of gradient "
          "consumed, median [min, max]")
    print(f"{'kernel':24} {'native GB/s':>24} {'portable GB/s':>24} {'portable / native':>26}")
    worst = None
    for n in names:
        ratios = [p_[n] / n_[n] for n_, p_ in zip(native, portable)]
        med = statistics.median(ratios)
        worst = med if worst is None else min(worst, med)
        print(f"{n:24} {spread([r[n] for r in native]):>24} {spread([r[n] for r in portable]):>24}"
              f" {med:8.3f} [{min(ratios):5.3f}, {max(ratios):5.3f}]")
    print(f"lowest median portable / native: {worst:.3f} (goal: at least 0.95 on every kernel)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
