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
  rounds and mid-transfer, with a peer timeout of 10 000 ms so that the new
  process is back before the liveness check could name the dead one: the
  server sees the new process's transport epoch on its first packet and ends
  the job naming the restart. The survivor's pending call and the restarted
  worker's start fail with the server's text within RESTART_BOUND_S of the
  new process's start, long before the peer timeout, and every process has
  exited (the server with status 2, the refused job's) within EXIT_BOUND_S of
  the first error. The new process starts in a later second of the wall clock
  than the old one was built in: a worker's transport epoch counts seconds
  (job::fresh_epoch), and one restarted within the same second has its old
  epoch, which no transport can tell from the dead process (the job then ends
  as for a dead worker, after the peer timeout: docs/worker.md, "Limits").

Each scenario runs TRIALS times; the detection times are printed (median,
spread) for the record. Usage: failure_test.py BUILD_DIR
(in worker mode: failure_test.py BUILD_DIR --worker JOB NODE ROLE)
"""
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
# The restart scenarios: a Python worker takes 0.6-3 s to come back here
# (imports, EAL), which must be well inside the peer timeout.
RESTART_TIMEOUT_MS = 10000
# From the new process's start() to its refusal and the survivor's error (the
# server sees the restart on the first packet; 2 CPUs, 3 busy processes).
RESTART_BOUND_S = 1.0
# From the first error to every process's exit: the server's grace for a
# refused job (1 s, docs/ps-server.md), the workers' shutdown, and this 2-CPU
# machine's scheduling while a Python process starts (as BOUND_S).
EXIT_BOUND_S = 2.0 + 1.0


def worker_main(job, node, role):
    import numpy as np

    import mercury

    w = mercury.Worker(job, node)
    # The transport epoch is the wall clock's second at construction
    # (job::fresh_epoch): a test restarting this worker waits for a later one.
    print(f"constructed at {time.time():.3f}", flush=True)
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

    def __init__(self, argv, env=None):
        import subprocess

        self.lines = []
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1, env=env)
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

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.thread.join(timeout=5)
        self.proc.stdout.close()


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


class Failures(unittest.TestCase):
    def start(self, tmp, name, roles, env=None, settle=True, timeout_ms=TIMEOUT_MS):
        job = os.path.join(tmp, name + ".yaml")
        with open(job, "w") as f:
            f.write(JOB.format(name=name, tmp=tmp).replace("peer_timeout_ms: 5000",
                                                           f"peer_timeout_ms: {timeout_ms}"))
        server = Lines([os.path.join(BUILD, "apps", "ps-server"), "--config", job,
                        "--node", "server0"])
        server.wait_for("] waiting", 30)
        workers = [Lines([sys.executable, __file__, BUILD, "--worker", job, f"w{r}", role],
                         env=env) for r, role in enumerate(roles)]
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

    def restart_worker_trials(self, name, roles, what, settle=True):
        """Kills w1 and starts it again at once in each trial: the server, w0 and
        the new w1 must name the restart, and every process exit. Prints the times."""
        why = "worker w1 (rank 1) restarted mid-job (a new incarnation, new epoch); " \
              "a job cannot take a rank back: start the job again"
        times = []
        for trial in range(TRIALS):
            with tempfile.TemporaryDirectory() as tmp:
                server, (w0, w1) = self.start(tmp, f"{name}{trial}", roles, settle=settle,
                                              timeout_ms=RESTART_TIMEOUT_MS)
                again = None
                try:
                    if not settle:
                        time.sleep(0.2)  # both in their loops
                    # The new process's epoch must differ from the old one's: a
                    # later second of the wall clock (at most a second's wait).
                    _, built = w1.wait_for("constructed at", 1)
                    epoch_second = int(float(built.split()[-1]))
                    killed = time.monotonic()
                    w1.proc.send_signal(signal.SIGKILL)
                    w1.proc.wait()
                    time.sleep(max(0.0, epoch_second + 1 - time.time()))
                    again = Lines([sys.executable, __file__, BUILD, "--worker",
                                   os.path.join(tmp, f"{name}{trial}.yaml"), "w1", roles[1]])
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
                    if trial == 0:
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
                    times.append((t_start - killed, t_w0 - t_start, t_again - t_start,
                                  max(exits) - seen))
                finally:
                    for p in (w0, w1, server) + ((again,) if again else ()):
                        p.stop()

        def spread(i):
            v = [t[i] for t in times]
            return f"{statistics.median(v):.2f} s ({min(v):.2f}-{max(v):.2f})"
        print(f"\n{what}: back {spread(0)} after the kill; from its start, the survivor "
              f"failed after {spread(1)}, its own start after {spread(2)}; every process "
              f"exited {spread(3)} after the first error (medians of {TRIALS})", file=sys.stderr)

    def test_a_worker_restarted_between_rounds_ends_the_job_everywhere(self):
        self.restart_worker_trials("restart-idle", ["wait", "idle"],
                                   "worker killed between rounds and restarted")

    def test_a_worker_restarted_mid_transfer_ends_the_job_everywhere(self):
        self.restart_worker_trials("restart-stream", ["stream", "stream"],
                                   "worker killed mid-transfer and restarted", settle=False)

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
