#!/usr/bin/python3
"""Failures named fast, with nothing outstanding: ps-server and two Python
workers over net_memif, peer timeout 1500 ms.

* A worker killed (SIGKILL) while the other waits in a barrier and nothing
  else is in flight: the server names the dead worker, and the survivor's
  barrier fails with the server's text, within 1.125 x the peer timeout plus
  scheduling slack (the heartbeats of agg/control.h keep the transport's
  liveness clock running).
* The server killed while one worker waits in a barrier and the other is idle:
  the waiting worker's barrier fails naming the server within the same bound,
  and the idle worker's next call fails at once with the same text.
* A worker killed mid-transfer, both workers running back-to-back push_pulls
  of an 8 MB tensor: the server names it, and the survivor's push_pull fails
  naming it, within the same bound.
* A worker killed and restarted at once (the same node and job file), between
  rounds and mid-transfer, aimed at the wall-clock second its killed
  incarnation was built in: w1 builds its Worker (and takes its transport
  epoch, job::fresh_epoch) just after a second begins, and the process that
  replaces it has imported everything beforehand and builds its own as soon
  as w1 is dead. Epochs count milliseconds, so the two differ even within one
  second (when they counted seconds they were equal, the transport took the
  new process for the old one and the job ended as for a dead worker, after
  the peer timeout). Whether an attempt made the second depends on the
  machine's pace (w1's start-up, first round and kill take most of it), so it
  is counted and printed, not required: the case is pinned down without a
  clock by Job.FreshEpochsTwoMillisecondsApartDifferAndTheLaterIsNewer and
  EndpointUnit.APeerBackOneMillisecondLaterIsARestart, and here every attempt,
  in the second or not, must be named a restart. The peer timeout is
  10 000 ms, so that nothing could end the job before the restart is seen:
  the server sees the new process's epoch on its first packet, challenges
  the killed incarnation (docs/transport.md, "Epochs, the probe exchange and
  restarts"), and when that goes unanswered for a quarter of the peer
  timeout takes the restart and ends the job naming it. The survivor's
  pending call and the restarted worker's start fail with the server's text
  within RESTART_BOUND_S of the new process's start, long before the peer
  timeout, and every process has
  exited (the server with status 2, the refused job's) within EXIT_BOUND_S
  of the first error.

Each scenario runs TRIALS times; the detection times are printed (median,
spread) for the record. Usage: failure_test.py BUILD_DIR
(in worker mode: failure_test.py BUILD_DIR --worker JOB NODE ROLE [standby])
"""
import math
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from worker_api_test import JOB, test_main  # noqa: E402  (the two-worker memif job)

BUILD = None
TIMEOUT_MS = 1500
TRIALS = int(os.environ.get("MERCURY_FAILURE_TRIALS", "3"))
# Heartbeats every timeout / 8, the liveness check, and this 2-CPU machine's
# scheduling under 3 busy processes.
BOUND_S = TIMEOUT_MS / 1000 * 1.125 + 1.0
STREAM_ELEMENTS = 2 << 20  # 8 MB: a push_pull is many windows of packets
# The restart scenarios: far longer than anything before the restart is seen
# (the new process's EAL start-up and declare), so that only the restart can
# end the job.
RESTART_TIMEOUT_MS = 10000
# What the new process may take after the time it prints to build its
# Worker's epoch (reading the job file first): an attempt counts as within
# the second with this much room.
EPOCH_SLACK_S = 0.05
# Between w1's "ready" and its kill in the restart scenarios: a round is over
# and w0 waits in its barrier (between rounds), or both are in their loops.
RESTART_SETTLE_S = 0.1
# From the new process's start() to its refusal and the survivor's error (the
# server's challenge to the killed incarnation, unanswered for a quarter of
# the peer timeout; then 2 CPUs, 3 busy processes).
RESTART_BOUND_S = RESTART_TIMEOUT_MS / 4 / 1000 + 1.0
# From the first error to every process's exit: the server's grace for a
# refused job (1 s, docs/ps-server.md), the workers' shutdown, and this 2-CPU
# machine's scheduling while a Python process starts (as BOUND_S).
EXIT_BOUND_S = 2.0 + 1.0


def worker_main(job, node, role, standby=None):
    import numpy as np

    import mercury

    if standby == "standby":  # everything imported: build the Worker when told
        print("standing by", flush=True)
        sys.stdin.readline()
    # The transport epoch is the wall clock's millisecond when the Worker is
    # built (job::fresh_epoch), just after this.
    print(f"constructing at {time.time():.3f}", flush=True)
    w = mercury.Worker(job, node)
    size = STREAM_ELEMENTS if role == "stream" else 1000
    params = np.zeros(size, np.float32)
    w.declare("p", params)
    print("starting", flush=True)
    try:
        w.start()
    except mercury.WorkerError as e:  # a restarted worker, refused
        print(f"start failed: {e}", flush=True)
        w.shutdown()
        return
    grad = np.ones(size, np.float32)
    w.push_pull(0, grad).wait()
    print("ready", flush=True)
    if role == "wait":  # in a barrier the other rank never reaches
        try:
            w.barrier()
            print("barrier returned", flush=True)
        except mercury.WorkerError as e:
            print(f"failed: {e}", flush=True)
    elif role == "stream":  # always a transfer in flight, until one fails
        try:
            while True:
                w.push_pull(0, grad).wait()
        except mercury.WorkerError as e:
            print(f"failed: {e}", flush=True)
    elif role == "idle":  # nothing in flight; then a call after the failure
        time.sleep(float(os.environ.get("IDLE_S", "3600")))
        try:
            w.push_pull(0, np.ones(1000, np.float32)).wait()
            print("push_pull returned", flush=True)
        except mercury.WorkerError as e:
            print(f"later call failed: {e}", flush=True)
    w.shutdown()


class Lines:
    """A process's output lines with the monotonic time each arrived."""

    def __init__(self, argv, env=None, stdin=False):
        import subprocess

        self.lines = []
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.PIPE if stdin else None, text=True,
                                     bufsize=1, env=env)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, text, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for t, line in list(self.lines):
                if text in line:
                    return t, line
            time.sleep(0.01)
        raise AssertionError(f"no line with {text!r} in {timeout} s:\n" +
                             "\n".join(l for _, l in self.lines[-30:]))

    def tell(self, word):
        """A line on the process's stdin (a standing-by worker builds its Worker)."""
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.thread.join(timeout=5)
        self.proc.stdout.close()
        if self.proc.stdin is not None:
            self.proc.stdin.close()


def exit_times(procs, deadline):
    """When each of `procs` (Lines) exited, polled every 10 ms until they all
    have or the monotonic `deadline`: a list of times, None for one still running."""
    times = [None] * len(procs)
    while None in times and time.monotonic() < deadline:
        for i, p in enumerate(procs):
            if times[i] is None and p.proc.poll() is not None:
                times[i] = time.monotonic()
        time.sleep(0.01)
    return times


def job_file(tmp, name, timeout_ms):
    job = os.path.join(tmp, name + ".yaml")
    with open(job, "w") as f:
        f.write(JOB.format(name=name, tmp=tmp).replace("peer_timeout_ms: 5000",
                                                       f"peer_timeout_ms: {timeout_ms}"))
    return job


def server_of(job):
    server = Lines([os.path.join(BUILD, "apps", "ps-server"), "--config", job,
                    "--node", "server0"])
    server.wait_for("] waiting", 30)
    return server


def worker(job, node, role, env=None, standby=False):
    """A worker process; `standby`: it imports everything, prints "standing by"
    and builds its Worker when told (Lines.tell)."""
    return Lines([sys.executable, __file__, BUILD, "--worker", job, node, role] +
                 (["standby"] if standby else []), env=env, stdin=standby)


def constructing_at(proc):
    """The wall-clock time a worker process printed just before building its Worker."""
    return float(proc.wait_for("constructing at", 1)[1].split()[-1])


class Failures(unittest.TestCase):
    def start(self, tmp, name, roles, env=None, settle=True):
        job = job_file(tmp, name, TIMEOUT_MS)
        server = server_of(job)
        workers = [worker(job, f"w{r}", role, env) for r, role in enumerate(roles)]
        for w in workers:
            w.wait_for("ready", 60)
        if settle:
            time.sleep(0.5)  # every transfer settled: nothing outstanding anywhere
        return server, workers

    def kill_worker_trials(self, name, roles, what, settle=True, server_bound=False):
        """Kills w1 in each trial; w0 and the server must name it. Prints the times."""
        times = []
        for trial in range(TRIALS):
            with tempfile.TemporaryDirectory() as tmp:
                server, (w0, w1) = self.start(tmp, f"{name}{trial}", roles, settle=settle)
                try:
                    if not settle:
                        time.sleep(0.2)  # both in their loops
                    killed = time.monotonic()
                    w1.proc.send_signal(signal.SIGKILL)
                    t_w0, line = w0.wait_for("failed:", 30)
                    self.assertIn("w1", line)
                    t_srv, srv_line = server.wait_for("w1", 30)
                    times.append((t_w0 - killed, t_srv - killed))
                    if trial == 0:
                        print(f"\n  server: {srv_line}\n  w0: {line}", file=sys.stderr)
                    self.assertLess(t_w0 - killed, BOUND_S, line)
                    if server_bound:
                        self.assertLess(t_srv - killed, BOUND_S, srv_line)
                finally:
                    for p in (w0, w1, server):
                        p.stop()
        print(f"\n{what} after "
              f"{statistics.median(t for t, _ in times):.2f} s (median of {TRIALS}; "
              f"{min(t for t, _ in times):.2f}-{max(t for t, _ in times):.2f}), the server "
              f"named it after {statistics.median(s for _, s in times):.2f} s", file=sys.stderr)

    def test_a_dead_worker_is_named_by_the_server_and_the_survivor(self):
        self.kill_worker_trials("fail-worker", ["wait", "idle"],
                                "worker killed while idle: the survivor's barrier failed")

    def test_a_worker_dead_mid_transfer_is_named_by_the_server_and_the_survivor(self):
        self.kill_worker_trials("fail-stream", ["stream", "stream"],
                                "worker killed mid-transfer: the survivor's push_pull failed",
                                settle=False, server_bound=True)

    def restart_once(self, name, roles, settle, show):
        """Kills w1 and starts it again at once: the server, w0 and the new w1 must
        name the restart, and every process exit. Returns the times, and whether
        the two incarnations took their epochs in one second of the wall clock."""
        why = "worker w1 (rank 1) restarted mid-job (a new incarnation, new epoch); " \
              "a job cannot take a rank back: start the job again"
        with tempfile.TemporaryDirectory() as tmp:
            job = job_file(tmp, name, RESTART_TIMEOUT_MS)
            procs = [server_of(job)]
            server = procs[0]
            try:
                w0 = worker(job, "w0", roles[0])
                procs.append(w0)
                w0.wait_for("starting", 60)  # in start(), waiting for w1
                # w1 and the process that will replace it, with everything
                # imported, each waiting for a word to build its Worker.
                w1 = worker(job, "w1", roles[1], standby=True)
                again = worker(job, "w1", roles[1], standby=True)
                procs += [w1, again]
                w1.wait_for("standing by", 60)
                again.wait_for("standing by", 60)
                # w1's epoch early in a second of the wall clock, so that its
                # successor's can fall in the same second.
                time.sleep(math.ceil(time.time()) + 0.01 - time.time())
                w1.tell("go")
                for w in (w0, w1):
                    w.wait_for("ready", 60)
                time.sleep(settle)
                killed = time.monotonic()
                w1.proc.send_signal(signal.SIGKILL)
                w1.proc.wait()
                again.tell("go")
                t_built, _ = again.wait_for("constructing at", 30)
                old, new = constructing_at(w1), constructing_at(again)
                t_start, _ = again.wait_for("starting", 30)
                t_again, again_line = again.wait_for("start failed:", 30)
                t_w0, w0_line = w0.wait_for("failed:", 30)
                t_srv, srv_line = server.wait_for("the job stopped", 30)
                self.assertIn(why, w0_line)
                self.assertIn("start: server server0 (10.0.0.1:47100) refused the "
                              "declarations: " + why, again_line)
                self.assertIn(why, srv_line)
                seen = min(t_again, t_w0, t_srv)
                exits = exit_times((server, w0, again), seen + EXIT_BOUND_S + 5)
                if show:
                    print(f"\n  server: {srv_line}\n  w0: {w0_line}\n  w1 again: "
                          f"{again_line}", file=sys.stderr)
                for t, line in ((t_again, again_line), (t_w0, w0_line)):
                    self.assertLess(t - t_start, RESTART_BOUND_S, line)
                    self.assertLess(t - killed, RESTART_TIMEOUT_MS / 1000, line)
                for t, label in zip(exits, ("server", "w0", "w1 again")):
                    self.assertIsNotNone(t, f"{label} did not exit")
                    self.assertLess(t - seen, EXIT_BOUND_S, label)
                self.assertEqual(server.proc.returncode, 2)  # a refused job
                self.assertEqual(w0.proc.returncode, 0)
                self.assertEqual(again.proc.returncode, 0)
                # The case an epoch of seconds could not tell apart: both
                # incarnations' epochs in one second of the wall clock.
                same = math.floor(old) == math.floor(new + EPOCH_SLACK_S)
                return (t_built - killed, new - old, t_w0 - t_start, t_again - t_start,
                        max(exits) - seen), same
            finally:
                for p in procs:
                    p.stop()

    def restart_worker_trials(self, name, roles, what, settle):
        """TRIALS restarts, each named as a restart; how many fell within the
        killed incarnation's second is printed."""
        times, in_second = [], 0
        for i in range(TRIALS):
            t, same = self.restart_once(f"{name}{i}", roles, settle, show=not times)
            times.append(t)
            in_second += same

        def spread(i, unit=1.0, fmt="{:.2f}"):
            v = [t[i] * unit for t in times]
            return (fmt.format(statistics.median(v)) + " (" + fmt.format(min(v)) + "-" +
                    fmt.format(max(v)) + ")")
        ms = (1000, "{:.0f}")
        print(f"\n{what}: built again {spread(0, *ms)} ms after the kill, {spread(1, *ms)} ms "
              f"after the killed one ({in_second} of {TRIALS} in its second); from its start(), "
              f"the survivor failed after {spread(2, *ms)} ms, its own start after {spread(3, *ms)} ms; "
              f"every process exited {spread(4)} s after the first error (medians of {TRIALS})",
              file=sys.stderr)

    def test_a_worker_restarted_between_rounds_ends_the_job_everywhere(self):
        self.restart_worker_trials("restart-idle", ["wait", "idle"],
                                   "worker killed between rounds and restarted",
                                   RESTART_SETTLE_S)

    def test_a_worker_restarted_mid_transfer_ends_the_job_everywhere(self):
        self.restart_worker_trials("restart-stream", ["stream", "stream"],
                                   "worker killed mid-transfer and restarted", RESTART_SETTLE_S)

    def test_a_dead_server_fails_the_waiting_and_the_idle_worker(self):
        times = []
        for trial in range(TRIALS):
            with tempfile.TemporaryDirectory() as tmp:
                env = dict(os.environ, IDLE_S=str(BOUND_S + 1))
                server, (w0, w1) = self.start(tmp, f"fail-server{trial}", ["wait", "idle"], env)
                try:
                    killed = time.monotonic()
                    server.proc.send_signal(signal.SIGKILL)
                    t_w0, line = w0.wait_for("failed:", 30)
                    self.assertIn("server0", line)
                    times.append(t_w0 - killed)
                    if trial == 0:
                        print(f"\n  w0: {line}", file=sys.stderr)
                    self.assertLess(t_w0 - killed, BOUND_S, line)
                    _, later = w1.wait_for("later call failed:", 30)
                    self.assertIn("server0", later)
                finally:
                    for p in (w0, w1, server):
                        p.stop()
        print(f"\nserver killed while workers idle: a waiting worker failed after "
              f"{statistics.median(times):.2f} s (median of {TRIALS}; {min(times):.2f}-"
              f"{max(times):.2f})", file=sys.stderr)


if __name__ == "__main__":
    test_main(sys.modules[__name__], worker_main)
