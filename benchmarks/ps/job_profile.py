#!/usr/bin/python3
"""Where a whole job's CPU time goes: the memif job (one ps-server, N ps-worker processes,
as `make demo` runs it, optimizer sum) under `perf record -a -e cpu-clock`, counted only
inside the rounds' push_pull windows, per thread and per function, beside the job's own
counters and the raw memif rate measured in the same run (docs/performance.md).

  benchmarks/ps/job_profile.py [--build build] [--model resnet50] [--workers 4]
                               [--rounds 6] [--freq 2000] [--top 12] [--keep DIR]
                               [--job FILE]

Threads are named by role: `ps-server` (the server's net core), `mercury-shardN` (a
shard core), `mercury-net` (a worker's net core), `ps-worker` (the trainer thread),
`swapper` (idle). The first round is a warm-up and is not counted. `--job FILE` profiles
that job file instead of the generated one (it must use optimizer sum).
"""
import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "peers"))
import peers_bench  # noqa: E402  (the memif job file both benchmarks run)


# The job's frames: MTU 9000, 8896 bytes of payload each (payload_per_packet(9000)).
RAW_FRAME = 9000
PAYLOAD = 8896


def raw_memif(build):
    """Raw memif between two processes at the job's MTU: frames/s, the median of 5 repetitions
    of memif_rate_bench raw/9000 (a single run is unsteady: the first in a process has been
    seen at 2.7x the others)."""
    name = "raw/%d" % RAW_FRAME
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        r = subprocess.run(
            [os.path.join(build, "benchmarks/net/memif_rate_bench"), "--benchmark_filter=" + name,
             "--benchmark_min_time=0.5", "--benchmark_repetitions=5", "--min_cpu_share=0",
             "--benchmark_out=" + f.name, "--benchmark_out_format=json"],
            capture_output=True, text=True, timeout=300, cwd=ROOT)
        runs = [b for b in json.load(open(f.name))["benchmarks"]
                if name in b["name"] and b.get("aggregate_name") == "median"]
    if r.returncode != 0 or not runs:
        sys.exit("job_profile: memif_rate_bench gave no %s figure:\n%s" % (name, r.stdout[-2000:]))
    return runs[0]["pps"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--freq", type=int, default=2000)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--keep", help="keep perf.data and the job's output in this directory")
    ap.add_argument("--job", help="a job file to run instead of the generated memif job")
    ap.add_argument("--reuse", action="store_true",
                    help="with --keep: analyse the perf.data and output kept there, run nothing")
    a = ap.parse_args()
    work = a.keep or tempfile.mkdtemp(prefix="job-profile-")
    os.makedirs(work, exist_ok=True)
    job = a.job
    if job is None:
        job = os.path.join(work, "job.yaml")
        with open(job, "w") as f:
            f.write(peers_bench.memif_job(a.workers, "prof%d" % a.workers))
    model = os.path.join(ROOT, "config/models", a.model + ".txt")
    data = os.path.join(work, "perf.data")
    if a.reuse:
        stdout = open(os.path.join(work, "job.out")).read()
        raw_before, raw_after = json.load(open(os.path.join(work, "raw.json")))
    else:
        raw_before = raw_memif(a.build)
        r = subprocess.run(
            ["perf", "record", "-a", "-e", "cpu-clock", "-F", str(a.freq), "-k",
             "CLOCK_MONOTONIC", "-o", data, "--", os.path.join(a.build, "apps/ps-demo"),
             "--config", job, "--model", model, "--rounds", str(a.rounds), "--verify", "last",
             "--timestamps"], capture_output=True, text=True, timeout=3600, cwd=ROOT)
        stdout = r.stdout
        open(os.path.join(work, "job.out"), "w").write(r.stdout + r.stderr)
        if r.returncode != 0 or "the last round's aggregate exact" not in r.stdout:
            sys.exit("job_profile: the job failed (output in %s/job.out)" % work)
        raw_after = raw_memif(a.build)
        json.dump([raw_before, raw_after], open(os.path.join(work, "raw.json"), "w"))

    # Round windows: from the first rank's start to the last rank's end.
    windows = collections.defaultdict(lambda: [float("inf"), 0.0])
    secs = collections.defaultdict(list)
    for rnd, s, start, end in re.findall(
            r"\] w\d+ round +(\d+): +([\d.]+) s.*start=(\d+) end=(\d+)", stdout):
        w = windows[int(rnd)]
        w[0] = min(w[0], int(start) / 1e9)
        w[1] = max(w[1], int(end) / 1e9)
        secs[int(rnd)].append(float(s))
    timed = sorted(k for k in windows if k > 1)
    spans = [windows[k] for k in timed]
    window_s = sum(e - s for s, e in spans)
    iteration = sorted(max(secs[k]) for k in timed)[len(timed) // 2]

    def inside(t):
        return any(s <= t <= e for s, e in spans)

    script = subprocess.run(["perf", "script", "-i", data, "-F", "comm,tid,time,ip,sym,dso"],
                            capture_output=True, text=True, timeout=1800)
    by_thread = collections.Counter()
    by_func = collections.defaultdict(collections.Counter)
    total = 0
    line_re = re.compile(r"^\s*(.+?)\s+(\d+)\s+([\d.]+):\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)$")
    for line in script.stdout.splitlines():
        m = line_re.match(line)
        if not m:
            continue
        comm, _tid, t, sym, dso = m.groups()
        if not inside(float(t)):
            continue
        role = "idle" if comm.startswith("swapper") else comm
        sym = re.sub(r"\+0x[0-9a-f]+$", "", sym.strip())
        if sym in ("", "[unknown]"):
            sym = "[%s]" % os.path.basename(dso)
        sym = re.sub(r"^mercury::", "", sym)
        sym = re.sub(r"\(.*$", "", sym)
        by_thread[role] += 1
        by_func[role][sym] += 1
        total += 1
    possible = window_s * a.freq * os.cpu_count()

    # The server's own counters, from its last line.
    stopped = re.search(r"stopped; (\d+) aggregations, (\d+) retransmissions"
                        r"(?: \([^)]*\))?, drops:(.*)", stdout)
    model_bytes = sum(int(l.split()[1]) * 4 for l in open(model)
                      if l.split("#", 1)[0].strip())
    through_server = 2 * a.workers * model_bytes  # every gradient in, every update out
    raw = min(raw_before, raw_after)
    # Raw memif already keeps both CPUs busy (a sender and a receiver): the
    # server's bytes in and out cannot move faster than that one stream.
    limit_s = through_server / (raw * PAYLOAD)

    print("job: %s, %d workers, %s (%.1f MB per worker), %d rounds (first not counted)" %
          (os.path.basename(job), a.workers, a.model, model_bytes / 1e6, a.rounds))
    print("iteration (slowest rank, median): %.3f s; raw memif %.3f / %.3f M frames/s at %d B "
          "(before / after); limit %.3f s (%.0f MB through the server); ratio %.2fx" %
          (iteration, raw_before / 1e6, raw_after / 1e6, RAW_FRAME, limit_s,
           through_server / 1e6, iteration / limit_s))
    if stopped:
        print("server: %s aggregations, %s retransmissions, drops:%s" % stopped.groups())
    print("samples: %d in %.2f s of rounds on %d CPUs (%.0f possible: %.1f%% of the CPUs' time "
          "ran no thread at all)\n" % (total, window_s, os.cpu_count(), possible,
                                       100.0 * max(possible - total, 0) / max(possible, 1)))
    print("| thread | share of all CPUs | top functions (share of the thread) |")
    print("| --- | --- | --- |")
    for role, n in by_thread.most_common():
        funcs = ", ".join("%s %.0f%%" % (f, 100.0 * c / n)
                          for f, c in by_func[role].most_common(a.top))
        print("| %s | %.1f%% | %s |" % (role, 100.0 * n / max(total, 1), funcs))
    if not a.keep:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
