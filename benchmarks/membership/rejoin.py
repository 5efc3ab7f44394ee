#!/usr/bin/python3
"""How soon a restarted worker computes again (docs/membership.md, "Joining").

The `make demo` job over net_memif (config/memif.yaml: ps-server with 2 shards and
4 ps-worker processes, the default peer timeout 1.5 s) with ResNet-50's tensor set (config/models/resnet50.txt) under
an asynchronous mode, free-running rounds of COMPUTE_MS each. Once every worker has
run a few rounds, w2 is killed (SIGKILL) and started again at once; the new process
joins the running job and its start returns once its first pull is whole (every
chunk's newest version in its buffers): the line "started in ...: joined the running
job at version V". Per run it reports:

* join: from the new process's start (just before it is spawned) to that line, as a
  ratio to the goal's limit, 3 s;
* vs start: the same time against the one the job's first w2 took from its spawn to
  its own "started in" line in the same run (the peer: a process that starts with the
  job; both include EAL's start-up and the memif link).

Modes are interleaved run by run; prints the median and [min, max] over the runs.
The processes are stopped once the new w2 has run JOINED_ROUNDS rounds (the others'
rounds are endless: with a rank's pushes lost the job's final check cannot hold).

  /usr/bin/python3 benchmarks/membership/rejoin.py BUILD_DIR [--runs 5] [MODE ...]
"""
import argparse
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from survivors import spread  # noqa: E402  (this directory's: median [min, max])

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOAL_S = 3.0
COMPUTE_MS = 50
ROUNDS_BEFORE = 5  # every worker's rounds before the kill
JOINED_ROUNDS = 3
MODES = {
    "asp": "sync: asp\n  optimizer: sgd\n  learning_rate: 0.0625",
    "psplus": "sync: psplus\n  staleness_lr: none\n  optimizer: sgd\n  learning_rate: 0.0625",
}
KILLED = "w2"


def job_file(tmp, mode):
    with open(os.path.join(ROOT, "config", "memif.yaml")) as f:
        text = f.read()
    head = "training:\n  sync: bsp\n  optimizer: sgd\n  learning_rate: 0.01\n"
    assert head in text, "config/memif.yaml's training section changed"
    text = text.replace(head, "training:\n  " + MODES[mode] + "\n")
    # The default peer timeout: the server takes the new process's epoch once the old
    # one leaves its challenge unanswered for a quarter of it (docs/transport.md).
    timeout = "  peer_timeout_ms: 5000"
    assert timeout in text, "config/memif.yaml's peer timeout changed"
    text = text.replace(timeout, "  peer_timeout_ms: 1500")
    # Sockets of this run only, so that runs never meet each other's.
    text = text.replace("/tmp/mercury/", f"/tmp/mercury-rejoin-{os.getpid()}/")
    path = os.path.join(tmp, f"rejoin-{mode}.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


class Proc:
    """A process whose output lines are queued with the time each was read."""

    def __init__(self, name, argv):
        self.name = name
        self.spawned = time.monotonic()
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, bufsize=1, cwd=ROOT)
        self.lines = queue.Queue()
        self.log = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.put((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, pattern, timeout):
        """(time, match) of the first line matching `pattern`; exits on a timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                t, line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.p.poll() is not None:
                    break
                continue
            self.log.append(line)
            m = re.search(pattern, line)
            if m:
                return t, m
        sys.exit(f"rejoin: {self.name} printed no line matching {pattern!r}:\n"
                 + "\n".join(self.log[-20:]))

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
        self.p.wait()


def run(build, mode):
    with tempfile.TemporaryDirectory() as tmp:
        job = job_file(tmp, mode)
        model = os.path.join(ROOT, "config", "models", "resnet50.txt")

        def worker(node):
            return Proc(node, [os.path.join(build, "apps", "ps-worker", "ps-worker"), "--config", job,
                               "--node", node, "--model", model, "--rounds", "1000000",
                               "--compute-ms", str(COMPUTE_MS)])

        server = Proc("server0", [os.path.join(build, "apps", "ps-server"), "--config", job,
                                  "--node", "server0"])
        procs = [server]
        try:
            workers = {n: worker(n) for n in ("w0", "w1", "w2", "w3")}
            procs += workers.values()
            t_start, _ = workers[KILLED].wait_for(r"started in", 120)
            first_start = t_start - workers[KILLED].spawned
            for w in workers.values():
                w.wait_for(rf"round +{ROUNDS_BEFORE}:", 120)
            workers[KILLED].p.send_signal(signal.SIGKILL)
            workers[KILLED].p.wait()
            again = worker(KILLED)
            procs.append(again)
            t_joined, m = again.wait_for(r"started in [\d.]+ s: joined the running job at "
                                         r"version (\d+)", 120)
            join = t_joined - again.spawned
            again.wait_for(rf"round +{JOINED_ROUNDS}:", 120)
            return join, first_start, int(m.group(1))
        finally:
            for p in reversed(procs):
                p.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("build")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("modes", nargs="*", default=list(MODES))
    a = p.parse_args()
    build = os.path.abspath(a.build)
    got = {m: ([], []) for m in a.modes}
    for i in range(a.runs):
        for mode in a.modes:
            join, first, version = run(build, mode)
            got[mode][0].append(join / GOAL_S)
            got[mode][1].append(join / first)
            print(f"run {i + 1} {mode}: joined at version {version} {join:.3f} s after its "
                  f"spawn ({join / GOAL_S:.3f} of the {GOAL_S:.0f} s goal); the job's first w2 "
                  f"started in {first:.3f} s", flush=True)
    for mode in a.modes:
        print(f"{mode}: join / {GOAL_S:.0f} s goal {spread(got[mode][0])}; "
              f"join / first start {spread(got[mode][1])} ({a.runs} runs)")


if __name__ == "__main__":
    main()
