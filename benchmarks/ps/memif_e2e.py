#!/usr/bin/python3
"""End-to-end push_pull goodput of a whole job in separate processes over
net_memif (ps-server + 4 ps-worker, the `make demo` job), beside the raw
memif rate between two processes measured in the same run.

  benchmarks/ps/memif_e2e.py [--build build] [--reps 5] [--models resnet50,vgg16]

Each repetition runs, in random order, the raw limit (memif_rate_bench's
raw/1500 variant: one memif link between two processes, both polling, 1514-
byte frames counted as the 1408 payload bytes a job's packet carries at MTU
1500 (net::payload_per_packet), which is what both CPUs of a 2-CPU machine
move when they do nothing but copy) and one job per model (ps-demo on
config/memif.yaml: ps-server with 2 shard cores and 4 ps-worker processes,
each checking every aggregate). The job's goodput is the gradient pushed plus
the parameters pulled by all four workers per second of push_pull (the sum
of the workers' own figures); the ratio job / raw is taken per repetition.
Figures: median [min, max] over the repetitions.
"""
import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROUNDS = {"resnet50": 3, "vgg16": 2}
PAYLOAD_PER_PACKET = 1408  # net::payload_per_packet(1500)


def raw_gbps(build):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        r = subprocess.run(
            [os.path.join(build, "benchmarks/net/memif_rate_bench"), "--benchmark_filter=raw/1500",
             "--benchmark_min_time=0.5", "--min_cpu_share=0", "--benchmark_out=" + f.name,
             "--benchmark_out_format=json"],
            capture_output=True, text=True, timeout=300, cwd=ROOT)
        runs = [b for b in json.load(open(f.name))["benchmarks"] if "raw/1500" in b["name"]]
    if r.returncode != 0 or not runs:
        sys.exit("memif_e2e: memif_rate_bench gave no raw/1500 figure:\n" + r.stdout[-2000:])
    return runs[0]["pps"] * PAYLOAD_PER_PACKET * 8 / 1e9


def job_gbps(build, model):
    r = subprocess.run(
        [os.path.join(build, "apps/ps-demo"), "--config", "config/memif.yaml", "--model",
         os.path.join("config/models", model + ".txt"), "--rounds", str(ROUNDS[model])],
        capture_output=True, text=True, timeout=900, cwd=ROOT)
    rates = [float(x) for x in re.findall(r"w\d: done, .* \(([\d.]+) Gbit/s\)", r.stdout)]
    if r.returncode != 0 or len(rates) != 4 or "every aggregate exact" not in r.stdout:
        sys.exit("memif_e2e: the %s job failed:\n%s" % (model, r.stdout[-3000:] + r.stderr))
    return sum(rates)


def summary(xs):
    return "%.3g [%.3g, %.3g]" % (statistics.median(xs), min(xs), max(xs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--models", default="resnet50,vgg16")
    a = ap.parse_args()
    models = a.models.split(",")
    raw, job, ratio = [], {m: [] for m in models}, {m: [] for m in models}
    for rep in range(a.reps):
        order = ["raw"] + models
        random.shuffle(order)
        got = {}
        for v in order:
            got[v] = raw_gbps(a.build) if v == "raw" else job_gbps(a.build, v)
            print("rep %d %-9s %7.2f Gbit/s" % (rep + 1, v, got[v]), flush=True)
        raw.append(got["raw"])
        for m in models:
            job[m].append(got[m])
            ratio[m].append(got[m] / got["raw"])
    print("\nvariant     Gbit/s, median [min, max]       ratio to raw memif, median [min, max]")
    print("raw memif   %-30s limit" % summary(raw))
    for m in models:
        print("%-11s %-30s %s" % (m, summary(job[m]), summary(ratio[m])))


if __name__ == "__main__":
    main()
