#!/usr/bin/python3
"""A hot standby's takeover time (docs/durability.md, "A hot standby"): the job of
peers_bench.py --standby (server0 with a standby server0b, N ps-workers, every node a
process in a network namespace on a bridge, net_af_packet), momentum so that the standby
holds optimizer state; server0 is killed (SIGKILL) at a round and not restarted.

  benchmarks/peers/failover_bench.py [--build build] [--model resnet50] [--workers 4]
                                     [--trials 5] [--rounds 30] [--kill-at 10]

Per trial: the time from the kill to the standby's promotion line, and to the first round
completed on w0 after the kill (its first aggregation after it: a round is every
tensor's push_pull). The limit it is compared with is the job's peer timeout
(network.peer_timeout_ms, read from the job file the trial ran) plus 1 s; the table gives
the median [min, max] over the trials of each time and of its ratio to that limit
(goal <= 1). Every worker checks every round bit for bit against the unbroken run
(ps-worker --verify every): a trial whose job failed or rolled back is reported WRONG.
Needs root; run with /usr/bin/python3.
"""
import argparse
import os
import re
import signal
import statistics
import subprocess
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


def trial(build, model, workers, rounds, kill_at, tag):
    text, names = bridge_job(workers, "failover%d" % workers, True, TRAINING)
    timeout_s = int(re.search(r"peer_timeout_ms: (\d+)", text).group(1)) / 1000.0
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
        job = f.name
    ns = {}
    procs = {}
    try:
        ns.update(bridge_namespaces(tag, names))
        for node in names:
            argv = ([os.path.join(build, "apps/ps-worker/ps-worker"), "--model", model,
                     "--rounds", str(rounds)] if node.startswith("w")
                    else [os.path.join(build, "apps/ps-server")])
            procs[node] = Lines(subprocess.Popen(
                ["ip", "netns", "exec", ns[node]] + argv + ["--config", job, "--node", node],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT))
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
        promoted = procs["server0b"].first(r"promoted: server0 lost", killed)
        first = procs["w0"].first(r"w0 round +\d+: ", killed)
        ok = (promoted is not None and first is not None and
              all(procs[n].proc.returncode == 0 for n in names if n != "server0") and
              all("done, %d rounds in" % rounds in procs[n].text() and
                  "rolled back" not in procs[n].text() for n in names if n.startswith("w")))
        if not ok:
            print("\n".join("--- %s\n%s" % (n, p.text()[-2000:]) for n, p in procs.items()))
        return ((promoted or killed) - killed, (first or killed) - killed, timeout_s + 1.0, ok)
    finally:
        for p in procs.values():
            if p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()
        remove_namespaces(ns)
        os.unlink(job)


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
    for t in range(a.trials):
        r = trial(a.build, model, a.workers, a.rounds, a.kill_at, "fo%d%d" % (os.getpid() % 1000, t))
        print("trial %d: promoted %.3f s, first round after the kill %.3f s after it, limit "
              "%.1f s, %s" % (t + 1, r[0], r[1], r[2], "exact" if r[3] else "WRONG"), flush=True)
        got.append(r)
    print("\n| model | workers | kill to promotion, s | kill to first round, s | "
          "first round / (peer timeout + 1 s) | correct |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("| %s | %d | %s | %s | %s | %s |" % (
        a.model, a.workers, summary([x[0] for x in got]), summary([x[1] for x in got]),
        summary([x[1] / x[2] for x in got]), "yes" if all(x[3] for x in got) else "NO"))


if __name__ == "__main__":
    main()
