#!/usr/bin/python3
"""How soon a restarted worker, or a spare, computes again (docs/membership.md,
"Joining", "Spare workers").

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

With --spare the job file has a fifth worker node, w4, a spare (`spare: true`,
training.spare_grace_s 0: it takes a removed rank at once), started with the others;
w2 is killed and not started again. Per run:

* takeover: from the kill to the spare's "started in ...: joined the running job" line
  (its first pull whole, as rank 2), as a ratio to the goal's 3 s; this includes the
  server's naming of the lost rank (the peer timeout, 1.5 s, x 1.125 at most);
* after removal: from the server's line removing w2 to the spare's line, the part the
  spare adds to a removal, as a ratio to the same 3 s.

Modes are interleaved run by run; prints the median and [min, max] over the runs.
The processes are stopped once the new w2 (the spare) has run JOINED_ROUNDS rounds (the
others' rounds are endless: with a rank's pushes lost the job's final check cannot
hold).

  /usr/bin/python3 benchmarks/membership/rejoin.py BUILD_DIR [--runs 5] [--spare] [MODE ...]
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


SPARE = ("\n  - name: w4\n    role: worker\n    spare: true\n    ipv4: 10.0.0.15\n"
         "    mac: 02:00:00:00:00:15\n"
         "    ports: [ \"net_memif14,role=client,id=0,socket=/tmp/mercury/w4.sock,bsize=9216\" ]\n"
         "    lcores: [9]\n")


def job_file(tmp, mode, spare=False):
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
    if spare:
        # w4, a spare, on the server's fifth port; it takes a removed rank at once.
        port = "      - net_memif3,role=server,id=0,socket=/tmp/mercury/w3.sock,bsize=9216\n"
        assert port in text, "config/memif.yaml's ports changed"
        text = text.replace(port, port + port.replace("memif3", "memif4").replace("w3", "w4"))
        text = text.replace("training:\n", "training:\n  spare_grace_s: 0\n", 1)
        text = text.rstrip("\n") + "\n" + SPARE
    # Sockets of this run only, so that runs never meet each other's.
    text = text.replace("/tmp/mercury/", f"/tmp/mercury-rejoin-{os.getpid()}/")
    path = os.path.join(tmp, f"rejoin-{mode}{'-spare' if spare else ''}.yaml")
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


def joined_rounds(proc):
    """Waits for JOINED_ROUNDS rounds of `proc` (its rounds count from the step it
    joined at)."""
    for _ in range(JOINED_ROUNDS):
        proc.wait_for(r" round +\d+:", 120)


def run(build, mode, spare=False):
    with tempfile.TemporaryDirectory() as tmp:
        job = job_file(tmp, mode, spare)
        model = os.path.join(ROOT, "config", "models", "resnet50.txt")

        def worker(node):
            return Proc(node, [os.path.join(build, "apps", "ps-worker", "ps-worker"), "--config", job,
                               "--node", node, "--model", model, "--rounds", "1000000",
                               "--compute-ms", str(COMPUTE_MS)])

        server = Proc("server0", [os.path.join(build, "apps", "ps-server"), "--config", job,
                                  "--node", "server0"])
        procs = [server]
        try:
            names = ("w0", "w1", "w2", "w3") + (("w4",) if spare else ())
            workers = {n: worker(n) for n in names}
            procs += workers.values()
            t_start, _ = workers[KILLED].wait_for(r"started in", 120)
            first_start = t_start - workers[KILLED].spawned
            for n in names[:4]:
                workers[n].wait_for(rf"round +{ROUNDS_BEFORE}:", 120)
            t_kill = time.monotonic()
            workers[KILLED].p.send_signal(signal.SIGKILL)
            workers[KILLED].p.wait()
            if spare:
                t_joined, m = workers["w4"].wait_for(
                    r"started in [\d.]+ s: joined the running job at version (\d+)", 120)
                t_removed, _ = server.wait_for(rf"worker {KILLED} \(rank 2\) .*removed", 5)
                joined_rounds(workers["w4"])
                return t_joined - t_kill, t_joined - t_removed, int(m.group(1))
            again = worker(KILLED)
            procs.append(again)
            t_joined, m = again.wait_for(r"started in [\d.]+ s: joined the running job at "
                                         r"version (\d+)", 120)
            join = t_joined - again.spawned
            joined_rounds(again)
            return join, first_start, int(m.group(1))
        finally:
            for p in reversed(procs):
                p.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("build")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--spare", action="store_true",
                   help="a spare worker takes the killed rank over (no restart)")
    p.add_argument("modes", nargs="*", default=list(MODES))
    a = p.parse_intermixed_args()
    build = os.path.abspath(a.build)
    got = {m: ([], []) for m in a.modes}
    for i in range(a.runs):
        for mode in a.modes:
            if a.spare:
                takeover, after, version = run(build, mode, spare=True)
                got[mode][0].append(takeover / GOAL_S)
                got[mode][1].append(after / GOAL_S)
                print(f"run {i + 1} {mode}: the spare joined at step {version} {takeover:.3f} s "
                      f"after the kill ({takeover / GOAL_S:.3f} of the {GOAL_S:.0f} s goal), "
                      f"{after:.3f} s after the server removed w2", flush=True)
                continue
            join, first, version = run(build, mode)
            got[mode][0].append(join / GOAL_S)
            got[mode][1].append(join / first)
            print(f"run {i + 1} {mode}: joined at step {version} {join:.3f} s after its "
                  f"spawn ({join / GOAL_S:.3f} of the {GOAL_S:.0f} s goal); the job's first w2 "
                  f"started in {first:.3f} s", flush=True)
    for mode in a.modes:
        if a.spare:
            print(f"{mode}: spare, kill to first pull whole / {GOAL_S:.0f} s goal "
                  f"{spread(got[mode][0])}; removal to first pull whole / {GOAL_S:.0f} s "
                  f"{spread(got[mode][1])} ({a.runs} runs)")
            continue
        print(f"{mode}: join / {GOAL_S:.0f} s goal {spread(got[mode][0])}; "
              f"join / first start {spread(got[mode][1])} ({a.runs} runs)")


if __name__ == "__main__":
    main()
