#!/usr/bin/python3
"""A hot standby's takeover time (docs/durability.md, "A hot standby"): the job of
peers_bench.py --standby (server0 with a standby server0b, N ps-workers, every node a
process in a network namespace on a bridge, net_af_packet), momentum so that the standby
holds optimizer state; server0 is killed (SIGKILL) at a round and not restarted.

  benchmarks/peers/failover_bench.py [--build build] [--model resnet50] [--workers 4]
                                     [--trials 5] [--rounds 30] [--kill-at 10]

Per trial, times from the kill (CLOCK_MONOTONIC: the workers' --timestamps and w0's
timeline, docs/timeline.md, are on the same clock as this script):
  * promotion: w0's line that the standby took over (printed on its kPromoted; the
    standby's own "promoted" line comes up to 100 ms after the fact);
  * first aggregation: the first aggregated chunk w0 received after the kill (the start
    of the first `pull` phase of its timeline): what the goal bounds;
  * barrier: when w0's first round after the kill began (its barrier done by the standby);
  * first round: when that round's push_pull of every tensor ended (w0's --timestamps),
    and `round` the same round's push_pull time beside the one before the kill.
The limit is the job's peer timeout (network.peer_timeout_ms, read from the job file the
trial ran) plus 1 s; the table gives the median [min, max] over the trials of each time
and of the first aggregation's (goal <= 1) and the first round's ratio to that limit.
Every worker checks every round bit for bit against the unbroken run (ps-worker --verify
every): a trial whose job failed or rolled back is reported WRONG. Needs root; run with
/usr/bin/python3.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "pmd-tests", "common"))
from lines import Lines  # noqa: E402
from netns import bridge_namespaces, remove_namespaces  # noqa: E402
from peers_bench import bridge_job  # noqa: E402

TRAINING = "{sync: bsp, optimizer: momentum, learning_rate: 0.01, momentum: 0.9}"


def summary(xs):
    return "%.3f [%.3f, %.3f]" % (statistics.median(xs), min(xs), max(xs))


def round_stamps(text, node):
    """{round: (start, end)} of `node`'s push_pull rounds, in seconds (--timestamps)."""
    return {int(r): (int(a) / 1e9, int(b) / 1e9) for r, a, b in re.findall(
        r"%s round +(\d+): .* start=(\d+) end=(\d+)" % node, text)}


def first_pull(timeline_dir, after):
    """The start of the first `pull` phase of w0's timeline at or after `after` (s)."""
    try:
        with open(os.path.join(timeline_dir, "w0.json")) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError):
        return None
    starts = [e["ts"] / 1e6 for e in events if e.get("name") == "pull" and e["ts"] / 1e6 >= after]
    return min(starts) if starts else None


def trial(build, model, workers, rounds, kill_at, tag):
    text, names = bridge_job(workers, "failover%d" % workers, True, TRAINING)
    timeout_s = int(re.search(r"peer_timeout_ms: (\d+)", text).group(1)) / 1000.0
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
        job = f.name
    timeline = tempfile.mkdtemp(prefix="failover-timeline-")
    ns = {}
    procs = {}
    try:
        ns.update(bridge_namespaces(tag, names))
        for node in names:
            argv = ([os.path.join(build, "apps/ps-worker/ps-worker"), "--model", model,
                     "--rounds", str(rounds), "--timestamps"] if node.startswith("w")
                    else [os.path.join(build, "apps/ps-server")])
            env = dict(os.environ, MERCURY_TIMELINE=timeline) if node == "w0" else None
            procs[node] = Lines(subprocess.Popen(
                ["ip", "netns", "exec", ns[node]] + argv + ["--config", job, "--node", node],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                env=env))
        mark = "w0 round %3d:" % kill_at
        deadline = time.monotonic() + 600
        while mark not in procs["w0"].text() and time.monotonic() < deadline:
            if any(p.proc.poll() is not None for p in procs.values()):
                break
            time.sleep(0.002)
        if mark not in procs["w0"].text():
            for p in procs.values():
                if p.proc.poll() is None:
                    p.proc.kill()
                p.proc.wait()
                p.thread.join()
            sys.exit("failover_bench: w0 never reached round %d:\n%s" % (kill_at, "\n".join(
                "--- %s\n%s" % (n, p.text()[-1500:]) for n, p in procs.items())))
        procs["server0"].proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        for node, p in procs.items():
            try:
                p.proc.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.proc.kill()
                p.proc.wait()
            p.thread.join()
        promoted = procs["w0"].first(r"standby server0b .* took over from server0", killed)
        stamps = round_stamps(procs["w0"].text(), "w0")
        after = sorted(r for r, (a, _) in stamps.items() if a >= killed)
        aggregated = first_pull(timeline, killed)
        ok = (promoted is not None and after and after[0] - 1 in stamps and
              aggregated is not None and
              all(procs[n].proc.returncode == 0 for n in names if n != "server0") and
              all("done, %d rounds in" % rounds in procs[n].text() and
                  "rolled back" not in procs[n].text() for n in names if n.startswith("w")))
        if not ok:
            print("\n".join("--- %s\n%s" % (n, p.text()[-2000:]) for n, p in procs.items()))
            return None
        first, before = stamps[after[0]], stamps[after[0] - 1]
        return {"promotion": promoted - killed, "aggregation": aggregated - killed,
                "barrier": first[0] - killed, "round": first[1] - killed,
                "round_s": first[1] - first[0], "before_s": before[1] - before[0],
                "limit": timeout_s + 1.0}
    finally:
        for p in procs.values():
            if p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()
        remove_namespaces(ns)
        os.unlink(job)
        shutil.rmtree(timeline, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--kill-at", type=int, default=10)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("failover_bench: network namespaces need root")
    model = os.path.join(ROOT, "config/models", a.model + ".txt")
    got = []
    wrong = 0
    for t in range(a.trials):
        r = trial(a.build, model, a.workers, a.rounds, a.kill_at, "fo%d%d" % (os.getpid() % 1000, t))
        if r is None:
            print("trial %d: WRONG (the job failed, rolled back or was not timed)" % (t + 1),
                  flush=True)
            wrong += 1
            continue
        print("trial %d: from the kill: promoted %.3f s, first aggregation %.3f s, barrier %.3f s, "
              "first round %.3f s (its push_pull %.3f s, the one before %.3f s), limit %.1f s, "
              "exact" % (t + 1, r["promotion"], r["aggregation"], r["barrier"], r["round"],
                         r["round_s"], r["before_s"], r["limit"]), flush=True)
        got.append(r)
    if not got:
        sys.exit("failover_bench: no trial completed")

    def col(key, per_limit=False):
        return summary([x[key] / x["limit"] if per_limit else x[key] for x in got])
    print("\n| model | workers | kill to promotion, s | kill to first aggregation, s | "
          "kill to first round, s | round after / before, s | first aggregation / "
          "(peer timeout + 1 s) | first round / (peer timeout + 1 s) | correct |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("| %s | %d | %s | %s | %s | %s / %s | %s | %s | %s |" % (
        a.model, a.workers, col("promotion"), col("aggregation"), col("round"), col("round_s"),
        col("before_s"), col("aggregation", True), col("round", True),
        "yes" if wrong == 0 else "NO (%d of %d trials wrong)" % (wrong, a.trials)))


if __name__ == "__main__":
    main()
