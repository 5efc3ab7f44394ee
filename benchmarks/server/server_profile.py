#!/usr/bin/python3
"""Where one server core's time goes: server_bench's measured rounds, per function and per
part of the server, as a share of the server's time and in nanoseconds per data packet
(in or out), from perf's cpu-clock samples (the only event this VM has) or callgrind's
instruction counts (docs/performance.md, "What one server core can carry").

  benchmarks/server/server_profile.py [--build build-fp] [--filter server/sgd/16/]
                                      [--repetitions 3] [--freq 999] [--top 25]
                                      [--call-graph fp|dwarf] [--callgrind] [--keep DIR]

perf: `perf record -e cpu-clock --call-graph fp` on server_bench of a build with frame
pointers and without the tests (so the owner checks are compiled out, as in a deployed
build): `meson setup build-fp -Dtests=disabled -Dcpp_args=-fno-omit-frame-pointer`
(`--call-graph dwarf` unwinds any build, slower). A sample counts when
its call chain passes through the bench's `ServerPass::measured_pass` (the server's
passes of the measured rounds: not the workers, the start or the warm-up). A chain perf
could not unwind that far is lost; the script prints how many samples the bench's own
server time should have given beside how many it found.
Nanoseconds per packet: a function's share of the server's samples times the bench's
own `ns_per_packet` of the same run (which perf slows a little).

--callgrind: `valgrind --tool=callgrind --toggle-collect=*measured_pass*` instead, on a
build valgrind can decode (valgrind 3.19 has no AVX-512: `meson setup build-avx2
-Dnative=false -Dcpp_args=-march=x86-64-v3 -Dtests=disabled`), one repetition:
instructions per data packet, repeatable where times are not. Not run yet: no such
build has been made here.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARK = "ServerPass::measured_pass"

# The server's parts, by symbol (first match wins).
PARTS = [
    ("reduction + optimizer (agg kernels)", r"agg::.*(apply_n|apply_range|reduce_|sum_all|rank_sum)"),
    ("chunk table", r"agg::"),
    ("server node, shard, fan-out", r"server::"),
    ("endpoint", r"transport::Endpoint"),
    ("transport protocol (peer)", r"transport::"),
    ("scheduler", r"sched::"),
    ("frames: build, parse, header codec", r"net::(parse_frame|build_|make_frame)|wire::"),
    ("port (MemoryPort: the NIC driver's part)", r"net::MemoryPort"),
    ("loop", r"node::"),
    ("libc (memcpy, memset)", r"^__mem|^mem"),
    ("kernel (interrupts, preemption)", r"^\[k\]"),
]


def part_of(sym):
    for name, rx in PARTS:
        if re.search(rx, sym):
            return name
    return "other"


def bench_json(path, filt):
    runs = [b for b in json.load(open(path))["benchmarks"]
            if b.get("run_type") == "iteration" and filt.rstrip("/") in b["name"]
            and "error_occurred" not in b]
    if not runs:
        sys.exit("server_profile: the benchmark gave no figure for " + filt)
    ns = sorted(r["ns_per_packet"] for r in runs)
    packets = sum(r["packets"] for r in runs)
    return ns[len(ns) // 2], packets, runs


def perf_profile(a, work):
    data = os.path.join(work, "perf.data")
    out = os.path.join(work, "bench.json")
    cmd = ["perf", "record", "-e", "cpu-clock", "-F", str(a.freq), "--call-graph", a.call_graph,
           "-o", data, os.path.join(a.build, "benchmarks/server/server_bench"),
           "--benchmark_filter=" + a.filter, "--benchmark_repetitions=%d" % a.repetitions,
           "--benchmark_out=" + out, "--benchmark_out_format=json"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("server_profile: perf record failed:\n" + r.stderr[-3000:])
    ns_per_packet, _, runs = bench_json(out, a.filter)
    script = subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym", "--demangle"],
                            capture_output=True, text=True).stdout
    self_count = collections.Counter()
    total = server = 0
    for sample in script.split("\n\n"):
        frames = [l.strip() for l in sample.strip().split("\n") if l.strip()]
        if not frames:
            continue
        total += 1
        syms = []
        for f in frames:
            ip, _, sym = f.partition(" ")
            syms.append(("[k] " if ip.startswith("ffffffff") else "") + (sym or "?"))
        if not any(MARK in s for s in syms):
            continue
        server += 1
        self_count[syms[0]] += 1
    # The bench's own server time says how many samples its passes should have
    # had: fewer means chains perf could not unwind as far as the mark.
    expected = sum(r["ns_per_packet"] * r["packets"] for r in runs) * 1e-9 * a.freq
    print("perf: %d samples, %d in the server's measured passes (its server time at %d Hz:"
          " about %.0f)" % (total, server, a.freq, expected))
    print("the bench under perf: ns_per_packet %.0f (median of %d runs), Gbps %s" %
          (ns_per_packet, len(runs), ", ".join("%.1f" % r["Gbps"] for r in runs)))
    return self_count, server, ns_per_packet, "samples"


def callgrind_profile(a, work):
    out = os.path.join(work, "callgrind.out")
    res = os.path.join(work, "bench.json")
    cmd = ["valgrind", "--tool=callgrind", "--toggle-collect=*measured_pass*",
           "--callgrind-out-file=" + out, os.path.join(a.build, "benchmarks/server/server_bench"),
           "--benchmark_filter=" + a.filter, "--benchmark_repetitions=1",
           "--benchmark_out=" + res, "--benchmark_out_format=json"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("server_profile: valgrind failed:\n" + r.stderr[-3000:])
    _, packets, _ = bench_json(res, a.filter)
    ann = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", out],
                         capture_output=True, text=True).stdout
    counts = collections.Counter()
    total = 0
    for line in ann.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S.*)$", line)
        if not m:
            continue
        n = int(m.group(1).replace(",", ""))
        name = m.group(2)
        if "PROGRAM TOTALS" in name:
            total = n
            continue
        sym = name.split(":", 1)[1] if ":" in name else name
        sym = re.sub(r" \[[^]]*\]$", "", sym)
        counts[sym] += n
    if total == 0:
        total = sum(counts.values())
    print("callgrind: %d instructions in the server's measured passes, %d data packets:"
          " %.0f per packet" % (total, packets, total / packets))
    return counts, total, total / packets, "instructions"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build-fp")
    ap.add_argument("--filter", default="server/sgd/16/")
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--freq", type=int, default=999)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--call-graph", default="fp",
                    help="perf's --call-graph: fp (a build with -fno-omit-frame-pointer) or dwarf")
    ap.add_argument("--callgrind", action="store_true")
    ap.add_argument("--keep", help="keep the profile and the benchmark's output here")
    a = ap.parse_args()
    work = a.keep or tempfile.mkdtemp(prefix="server-profile-")
    os.makedirs(work, exist_ok=True)
    if a.callgrind:
        counts, total, per_packet, unit = callgrind_profile(a, work)
        per = "instr/packet"
    else:
        counts, total, per_packet, unit = perf_profile(a, work)
        per = "ns/packet"
    if total == 0:
        sys.exit("server_profile: nothing counted in the server's passes")
    parts = collections.Counter()
    for sym, n in counts.items():
        parts[part_of(sym)] += n
    print("\n%-44s %7s %12s" % ("part of the server", "share", per))
    for name, n in parts.most_common():
        print("%-44s %6.1f%% %12.1f" % (name, 100.0 * n / total, per_packet * n / total))
    print("\n%-80s %7s %12s" % ("function (self)", "share", per))
    for sym, n in counts.most_common(a.top):
        print("%-80s %6.1f%% %12.1f" % (sym[:80], 100.0 * n / total, per_packet * n / total))
    if not a.keep:
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
