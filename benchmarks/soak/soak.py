#!/usr/bin/python3
"""The soak benchmark: a parameter-server job run for a long time at 1 % loss, with
every process's memory sampled.

It runs ps-demo (one ps-server and four checking ps-workers over net_memif, the job
of config/memif.yaml with ResNet-50's tensors) with the link emulator dropping 1 % of
the frames each node sends (link.loss: 0.01) and, unless --no-auth, the authenticated
data plane on (a key file made for the run). Calibration measures the round time
(runs of 10 and 30 rounds); the soak then runs a third more rounds than fill --minutes
(10 by default), and fails if the job ended sooner. Every --every seconds it samples
each ps-server and ps-worker process's resident memory from /proc (VmRSS, split into
anonymous, file and shared) and address space (VmSize), and prints a line.
At the end: the job's own verdict (every ps-worker checked every aggregate of every
round, bit for bit, and ps-demo exits 0 only if all did), and per process the first
sample after warm-up, the last, and the largest growth of its resident memory and of
its address space (VmSize) after warm-up, and the fewest free mbufs the server's stats
line showed in any of its RX pools (0: a pool ran dry). Resident memory may grow by design: the
server reserves its staging chunks when it starts and touches their pages only as
copies first need them (docs/server.md, "Flow control"). What must not grow is the
address space: nothing is allocated once the job runs. It exits 1 if the job failed or
any process's address space grew by more than --max-growth-kb (1024 by default) after
warm-up. Samples go to a CSV (--csv); when the job fails, its whole output goes beside
it.

Usage: soak.py [--build build] [--minutes 10] [--every 30] [--csv BUILD/soak.csv]
"""
import argparse
import csv
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def job_file(directory, auth, mbufs):
    """config/memif.yaml with 1 % loss on every TX queue (and a key, and a pool size)."""
    with open(os.path.join(ROOT, "config", "memif.yaml")) as f:
        text = f.read()
    if mbufs:
        text = re.sub(r"(mempool:\n  mbufs: )\d+", rf"\g<1>{mbufs}", text, count=1)
    extra = "link:\n  loss: 0.01\n  seed: 7\n\n"
    if auth:
        key = os.path.join(directory, "soak.key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        text = text.replace("network:\n", "network:\n  auth_key_file: soak.key\n", 1)
    text = text.replace("training:\n", extra + "training:\n", 1)
    path = os.path.join(directory, "soak.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def memory(pid):
    """(VmRSS, RssAnon, RssFile, RssShmem, VmSize) in kB, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
    except OSError:
        return None
    values = []
    for key in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmSize"):
        m = re.search(rf"^{key}:\s+(\d+) kB", status, re.M)
        values.append(int(m.group(1)) if m else 0)
    return tuple(values)


def job_processes(root_pid):
    """{pid: name} of the ps-server and ps-worker processes under root_pid."""
    parent = {}
    names = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        parent[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
        names[int(entry)] = name
    out = {}
    for pid, name in names.items():
        if not name.startswith(("ps-server", "ps-worker")):
            continue
        p = pid
        while p > 1 and p != root_pid:
            p = parent.get(p, 1)
        if p == root_pid:
            out[pid] = name
    return out


def run(ps_demo, job, rounds, log):
    return subprocess.Popen([ps_demo, "--config", job, "--rounds", str(rounds)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--every", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=60, help="seconds before the reference sample")
    ap.add_argument("--max-growth-kb", type=int, default=1024)
    ap.add_argument("--no-auth", action="store_true")
    ap.add_argument("--mbufs", type=int, default=0,
                    help="mempool.mbufs of every node (0: the job file's); smaller pools show a leak sooner")
    ap.add_argument("--csv", default="", help="default: soak.csv in the build directory")
    a = ap.parse_args()
    a.csv = a.csv or os.path.join(a.build, "soak.csv")
    ps_demo = os.path.join(a.build, "apps", "ps-demo")
    if not os.access(ps_demo, os.X_OK):
        sys.exit(f"soak: {ps_demo} is not built (make build)")
    with tempfile.TemporaryDirectory(prefix="mercury-soak-") as tmp:
        job = job_file(tmp, not a.no_auth, a.mbufs)
        log_path = os.path.join(tmp, "ps-demo.log")
        # Two calibration runs, 10 and 30 rounds: their difference is 20 rounds
        # without the start-up.
        took = []
        for n in (10, 30):
            start = time.monotonic()
            with open(log_path, "w") as log:
                rc = run(ps_demo, job, n, log).wait()
            if rc != 0:
                sys.stderr.write(open(log_path).read()[-3000:])
                sys.exit(f"soak: the {n}-round calibration failed (exit {rc})")
            took.append(time.monotonic() - start)
        per_round = max((took[1] - took[0]) / 20, 1e-3)
        startup = max(took[0] - 10 * per_round, 0)
        # A third more than the estimate: round times vary with the losses
        # (0.8 to 2.6 s here), and a soak shorter than asked is no soak.
        rounds = max(20, int(1.3 * (a.minutes * 60 - startup) / per_round))
        print(f"soak: 1 % loss, {'authenticated' if not a.no_auth else 'no key'}, "
              f"{rounds} rounds of ResNet-50 (calibration: {per_round:.3f} s a round, "
              f"{startup:.0f} s to start), a sample every {a.every:.0f} s", flush=True)
        samples = []  # (t, pid, name, rss, anon, file, shmem, size)
        with open(log_path, "w") as log:
            p = run(ps_demo, job, rounds, log)
            t0 = time.monotonic()
            next_sample = t0 + 5
            while p.poll() is None:
                now = time.monotonic()
                if now >= next_sample:
                    procs = job_processes(p.pid)
                    line = []
                    for pid, name in sorted(procs.items(), key=lambda x: x[1]):
                        m = memory(pid)
                        if m is None:
                            continue
                        samples.append((now - t0, pid, name) + m)
                        line.append(f"{name}:{m[0] // 1024}M/{m[1]}k")
                    print(f"  {now - t0:6.0f} s  " + "  ".join(line), flush=True)
                    next_sample += a.every
                time.sleep(0.5)
            rc = p.returncode
        tail = open(log_path).read()
        # The server's stats line gives, each second, the fewest free mbufs of
        # any of its RX pools: an exhausted pool (memif counts no drop for it)
        # shows as 0 there.
        pool_free = [int(x) for x in re.findall(r"rx pool free (\d+)", tail)]
        if pool_free:
            print(f"soak: the server's RX pools: fewest free mbufs {min(pool_free)} "
                  f"({sum(1 for x in pool_free if x == 0)} of {len(pool_free)} stats lines at 0)",
                  flush=True)
        # Its last word: totals and every drop by reason; and any port whose link went down.
        for line in re.findall(r"^.*ps-server \S+: (?:stopped;|port \S+: link down).*$", tail,
                               re.M):
            print(f"soak: {line.strip()}", flush=True)
        if rc != 0:
            # The whole log beside the samples: a failure after minutes needs more than a tail.
            kept = os.path.splitext(a.csv)[0] + "-ps-demo.log"
            with open(kept, "w") as f:
                f.write(tail)
            print(f"soak: the job's whole output is in {kept}")
    with open(a.csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["seconds", "pid", "process", "rss_kb", "anon_kb", "file_kb", "shmem_kb",
                    "size_kb"])
        w.writerows((f"{s[0]:.1f}",) + s[1:] for s in samples)
    ran = time.monotonic() - t0
    print(f"soak: ps-demo exited {rc} after {ran:.0f} s; samples in {a.csv}")
    worst = 0
    by_pid = {}
    for s in samples:
        by_pid.setdefault((s[1], s[2]), []).append(s)
    print(f"{'process':<12} {'samples':>7} {'rss at warm-up':>15} {'rss last':>12} "
          f"{'rss growth kB':>14} {'size growth kB':>15}")
    for (pid, name), ss in sorted(by_pid.items(), key=lambda x: x[0][1]):
        warm = [s for s in ss if s[0] >= a.warmup] or ss[-1:]
        rss_growth = max(s[3] for s in warm) - warm[0][3]
        size_growth = max(s[7] for s in warm) - warm[0][7]
        worst = max(worst, size_growth)
        print(f"{name:<12} {len(ss):>7} {warm[0][3]:>12} kB {ss[-1][3]:>9} kB {rss_growth:>14} "
              f"{size_growth:>15}")
    if rc != 0:
        sys.stderr.write(tail[-3000:])
        print("soak: FAILED, the job did not complete exact")
        return 1
    if ran < a.minutes * 60:
        print(f"soak: FAILED, the job ran {ran:.0f} s, less than the {a.minutes * 60:.0f} s asked "
              f"(the calibration overestimated the round time: run again)")
        return 1
    if worst > a.max_growth_kb:
        print(f"soak: FAILED, a process's address space grew by {worst} kB after warm-up "
              f"(limit {a.max_growth_kb})")
        return 1
    print(f"soak: ok, the job ran exact and no process's address space grew by more than "
          f"{worst} kB after warm-up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
