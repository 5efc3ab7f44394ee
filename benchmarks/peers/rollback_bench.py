#!/usr/bin/python3
"""Several servers rolling back (docs/durability.md, "Several servers"): the job of
pmd-tests/apps/checkpoint_test.py kill2 (two server nodes, two ps-workers, BSP with
momentum, 2 % loss, checkpoints every 10 versions, every node a process in a network
namespace on a bridge, net_af_packet), s1 killed (SIGKILL) at w0's round and started
again at once with --resume; s0 rolls back from its own checkpoint. Beside it, trial by
trial, the same job with one server node (checkpoint_test.py kill): the peer run whose
time the two-server figure is a ratio of.

  benchmarks/peers/rollback_bench.py [--build build] [--trials 5] [--rounds 60]
                                     [--kill-at 40] [--kill s1] [--model FILE]

Per trial, times from the kill (CLOCK_MONOTONIC: w0's --timestamps are on the clock of
this script):
  * rolled back: w0's line that its rollback is done (read from its output);
  * first round: when the first round after the rollback (its push_pull of every
    tensor) ended: every chunk of the first version after the rollback aggregated, so
    the first aggregation came at most this long after the kill; and that round's
    push_pull beside the one before the kill. (w0's timeline is not used: its marks of
    a version it saw before the rollback are not made again.)
The table gives the median [min, max] over the trials of each, per variant (one server,
two), and of the two-server time over the one-server time of the same trial. Every
worker checks every round
bit for bit against the unbroken run that took the same rollback: a trial whose job
failed is reported WRONG. Needs root; run with /usr/bin/python3.
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "pmd-tests", "common"))
import server_kill  # noqa: E402
from failover_bench import round_stamps, summary  # noqa: E402

# checkpoint_test.py's model: four tensors, 27 364 parameters.
MODEL = "a 20000 100x200\nb 300 300\nc 7000 7000\nd 64 64\n"


def trial(build, model, rounds, kill_at, servers, kill, tag):
    tmp = tempfile.mkdtemp(prefix="rollback-bench-")
    try:
        out = server_kill.run(build, tmp, model, servers=servers, kill=kill, rounds=rounds,
                              kill_after=kill_at, worker_args=["--timestamps"], tag=tag)
        ok = (out.error is None and all(s == 0 for s, _ in out.workers + out.running) and
              out.restarted[0] == 0 and
              all("done, %d rounds (1 rolled back)" % rounds in t for _, t in out.workers))
        rolled = out.worker_lines[0].first(r"rolled back to version \d+: parameters exact",
                                           out.kill_time) if ok else None
        if rolled is None:
            print("trial of %d servers: the job failed" % servers)
            print("\n".join("--- %s\n%s" % (s, t[-2000:]) for s, t in out.everything()))
            return None
        text = out.workers[0][1]
        v = int(re.search(r"rolled back to version (\d+)", text).group(1))
        after = round_stamps(text[text.index("rolled back to version"):], "w0")
        before = round_stamps(text[:text.index("rolled back to version")], "w0")
        if v + 1 not in after or kill_at not in before:
            print("trial: rounds missing\n" + text[-2000:])
            return None
        first = after[v + 1]
        return {"rolled": rolled - out.kill_time, "round": first[1] - out.kill_time, "round_s": first[1] - first[0],
                "before_s": before[kill_at][1] - before[kill_at][0], "version": v}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--kill-at", type=int, default=40)
    ap.add_argument("--kill", default="s1", choices=["s0", "s1"])
    ap.add_argument("--model", help="a ps-worker model file (default: checkpoint_test.py's)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("rollback_bench: network namespaces need root")
    build = os.path.abspath(a.build)
    model = a.model
    if model is None:
        fd, model = tempfile.mkstemp(suffix=".txt", prefix="rollback-model-")
        with os.fdopen(fd, "w") as f:
            f.write(MODEL)
    got = {1: [], 2: []}
    ratios = {"rolled": [], "round": []}
    wrong = 0
    try:
        for t in range(a.trials):
            r = {}
            # Interleaved: one server, then two, in every trial.
            for servers, kill in ((1, "s0"), (2, a.kill)):
                r[servers] = trial(build, model, a.rounds, a.kill_at, servers, kill,
                                   "rb%d%d%d" % (os.getpid() % 1000, t, servers))
                if r[servers] is None:
                    print("trial %d, %d servers: WRONG (the job failed or was not timed)" %
                          (t + 1, servers), flush=True)
                    wrong += 1
                    continue
                x = r[servers]
                print("trial %d, %d servers: from the kill: rolled back to version %d at %.3f s, "
                      "first round after it done %.3f s (its push_pull %.3f s, the one before "
                      "the kill %.3f s), exact" % (t + 1, servers, x["version"], x["rolled"],
                                                   x["round"], x["round_s"], x["before_s"]),
                      flush=True)
                got[servers].append(x)
            if r[1] is not None and r[2] is not None:
                for k in ratios:
                    ratios[k].append(r[2][k] / r[1][k])
    finally:
        if a.model is None:
            os.unlink(model)
    if not got[1] or not got[2]:
        sys.exit("rollback_bench: no trial completed")

    def col(servers, key):
        return summary([x[key] for x in got[servers]])
    print("\n| servers (killed) | kill to rolled back, s | kill to first round after it "
          "done, s | round after / before, s | correct |")
    print("| --- | --- | --- | --- | --- |")
    for servers, kill in ((1, "s0"), (2, a.kill)):
        print("| %d (%s) | %s | %s | %s / %s | %s |" % (
            servers, kill, col(servers, "rolled"), col(servers, "round"),
            col(servers, "round_s"), col(servers, "before_s"),
            "yes" if wrong == 0 else "NO (%d runs wrong)" % wrong))
    print("| 2 over 1, same trial | %s | %s | | |" % (summary(ratios["rolled"]),
                                                    summary(ratios["round"])))


if __name__ == "__main__":
    main()
