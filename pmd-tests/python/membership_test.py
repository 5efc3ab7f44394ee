#!/usr/bin/python3
"""A lost worker leaves an asynchronous job (docs/membership.md): the digits CNN
(apps/train-digits) trained by 4 worker processes and ps-server over net_memif under
asp, ssp and psplus, with rank 2 killed (SIGKILL) right after the backward pass of
its step KILL_STEP, its gradients on their way to the server.

Every step sleeps COMPUTE_MS first (an accelerator's compute, as in the evaluation),
so the survivors train on for longer than the peer timeout after the kill.

Per mode, checked: the job ends cleanly (the server's status 0: every rank left or
was removed); the three others train every step of every epoch and rank 0's final
test accuracy: the ranks' mean at least 0.9 and each at least 0.8; the server names the lost
worker, removed, and counts one worker removed in its closing line; rank 0 counts one
worker removed (the servers' kWorkerGone); and the survivors' longest step, from the
kill on, stays within the liveness bound (the peer timeout, TIMEOUT_MS, 1.125 x with
the heartbeats, plus this 2-CPU machine's slack). How long they lose is printed for the
record; the figure, and their pace afterwards, are benchmarks/membership/survivors.py's.

Usage: membership_test.py BUILD_DIR [MODE ...]
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import digits_test  # noqa: E402  (its job file and paths)

BUILD = None
MODES = {
    # sync line, the server's optimizer: the evaluation's rate for one worker's batch per
    # update (docs/evaluation.md, section 3); psplus without its staleness rule (asp's
    # arithmetic with the eager pull: 0.2 under inverse_sqrt ended at 0.92-0.93 in 3 runs of
    # 12 epochs).
    "asp": "sync: asp\n  optimizer: sgd\n  learning_rate: 0.1",
    "ssp": "sync: ssp\n  staleness_bound: 2\n  optimizer: sgd\n  learning_rate: 0.1",
    "psplus": "sync: psplus\n  staleness_lr: none\n  optimizer: sgd\n  learning_rate: 0.1",
}
EPOCHS = 16
# The job learned: the ranks' mean final test accuracy reaches TARGET (the evaluation's
# for the asynchronous modes) and every rank's TARGET_EACH. Each rank's figure is its own
# parameters' (under asp and ssp a worker is sent only the answers to its own pushes) and
# an asynchronous run at a constant rate ends an epoch a few points up or down: one rank's
# final figure against 0.9 failed about one run in ten while the job had learned
# (rank 0 at 0.975, two others below 0.9; one rank at 0.66 after a spike in the last
# steps).
TARGET = 0.9
TARGET_EACH = 0.8
STEPS_PER_EPOCH = 22  # (1437 // 4) // 16
KILLED = 2
KILL_STEP = 30  # in the second epoch
# network.peer_timeout_ms: twice the default. This machine is shared; under a load of
# 15 on its 2 CPUs a server process was seen to get no CPU for 2 s, and the survivors'
# transports then gave up on it (benchmarks/membership/survivors.py measures with
# the default, 1500).
TIMEOUT_MS = 3000
# Each step sleeps this long first, standing for an accelerator's compute (as in the
# evaluation), so that the survivors train for long enough after the kill: the rank is
# removed about 1.125 x TIMEOUT_MS after it, a spare takes it over spare_grace_s (1 s)
# later, and a restarted process joins; the job must still be running then, with a few
# seconds to spare. The steps after the kill take at least (EPOCHS * STEPS_PER_EPOCH -
# KILL_STEP) * COMPUTE_MS: 8 s at 25 ms. At 10 ms (3.2 s) a fast run ended before the
# spare's grace had passed (the spare was released instead).
COMPUTE_MS = 25
BOUND_S = TIMEOUT_MS / 1000 * 1.125 + 2.0


def job_file(tmp, mode, timeout_ms=None):
    path = digits_test.job_file(tmp, "digits-leave-" + mode)
    with open(path) as f:
        text = f.read()
    network = "network:\n  mtu: 9000\n"
    assert network in text, text
    text = text.replace(network, network + f"  peer_timeout_ms: {timeout_ms or TIMEOUT_MS}\n")
    head = "training:\n  sync: bsp\n  optimizer: momentum\n  learning_rate: 0.1\n  momentum: 0.9\n"
    assert head in text, text
    with open(path, "w") as f:
        f.write(text.replace(head, "training:\n  " + MODES[mode] + "\n"))
    return path


def run(tmp, mode, epochs=EPOCHS, kill_step=KILL_STEP, extra=(), timeout_ms=None, job=None):
    """train_digits with rank KILLED killed at kill_step, on `job` (default: job_file's);
    (status, output, losses dir)."""
    losses = os.path.join(tmp, mode)
    r = subprocess.run([sys.executable, digits_test.SCRIPT, "--job",
                        job or job_file(tmp, mode, timeout_ms),
                        "--epochs", str(epochs), "--losses", losses, "--build", BUILD,
                        "--kill", f"{KILLED},{kill_step}", "--compute-ms", str(COMPUTE_MS),
                        "--target", "0", *extra],
                       capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout + r.stderr, losses


def check_accuracy(test, losses, nodes, out):
    """The ranks' final test accuracies (each node's .result): their mean at least TARGET,
    each at least TARGET_EACH."""
    accs = []
    for n in nodes:
        with open(os.path.join(losses, f"{n}.result")) as f:
            accs.append(float(f.read().split()[0]))
    print(f"\nfinal test accuracy {dict(zip(nodes, accs))}", file=sys.stderr)
    test.assertGreaterEqual(sum(accs) / len(accs), TARGET, f"{accs}\n{out}")
    test.assertGreaterEqual(min(accs), TARGET_EACH, f"{accs}\n{out}")


def steps_around_kill(losses, rank):
    """Rank `rank`'s step times (seconds) that ended before the kill and from it on,
    each step's time from the end of the one before; the first step of each epoch is
    left out (rank 0 evaluates between epochs)."""
    with open(os.path.join(losses, f"w{KILLED}.killed")) as f:
        killed = float(f.read())
    ends = np.loadtxt(os.path.join(losses, f"w{rank}.times"))
    steps, last = np.diff(ends), ends[1:]
    keep = (np.arange(1, len(ends)) % STEPS_PER_EPOCH) != 0
    steps, last = steps[keep], last[keep]
    return steps[last < killed], steps[last >= killed]


def survivors_loss(losses, survivors):
    """The survivors' longest step from the kill on, less their median step before it
    (seconds)."""
    worst = 0.0
    for r in survivors:
        before, after = steps_around_kill(losses, r)
        if len(after):
            worst = max(worst, float(after.max()) - float(np.median(before)))
    return worst


class EveryMode:
    """One test per asynchronous mode, each the class's check(mode)."""

    def test_asp(self):
        self.check("asp")

    def test_ssp(self):
        self.check("ssp")

    def test_psplus(self):
        self.check("psplus")


def check_joined(test, out, losses, node):
    """A process `node` joined the running job for rank KILLED: it says so and goes on from
    the step it joined at (the slowest rank's: at least as many as each other rank had
    completed before the kill, from their .times files) to the end of the epochs, and the
    other ranks trained every step. Returns that step."""
    joined = re.search(rf"{node}: joined the running job at version (\d+): going on from "
                       r"step (\d+)", out)
    test.assertIsNotNone(joined, out)
    version, step = int(joined.group(1)), int(joined.group(2))
    # Under psplus a rank may be several steps behind the killed one (no bound), so the
    # floor is what the others had done when it died, not the kill's step.
    with open(os.path.join(losses, f"w{KILLED}.killed")) as f:
        killed = float(f.read())
    done = [int((np.loadtxt(os.path.join(losses, f"w{r}.times")) < killed).sum())
            for r in range(4) if r != KILLED]
    print(f"\n{node} joined at version {version}; the other ranks had completed {done} steps "
          f"when w{KILLED} was killed at its step {KILL_STEP}", file=sys.stderr)
    test.assertGreaterEqual(version, max(1, min(done)), f"ranks' steps at the kill {done}\n{out}")
    test.assertEqual(step, version, out)
    total = EPOCHS * STEPS_PER_EPOCH
    curve = np.loadtxt(os.path.join(losses, f"{node}.txt"))
    test.assertEqual(len(curve), total - step, out)
    for r in range(4):
        if r != KILLED:
            curve = np.loadtxt(os.path.join(losses, f"w{r}.txt"))
            test.assertEqual(len(curve), total, f"w{r}\n{out}")
    return step


def main(case):
    """Runs the tests of class `case` of the calling script (__main__): BUILD_DIR [NAME ...],
    each NAME a mode, or what follows a test's "test_"."""
    global BUILD
    BUILD = os.path.abspath(sys.argv[1])
    digits_test.BUILD = BUILD
    names = [f"{case}.test_{m}" for m in sys.argv[2:]]
    unittest.main(module="__main__", argv=[sys.argv[0], *names], verbosity=2)


class LostWorker(EveryMode, unittest.TestCase):
    modes = list(MODES)

    def check(self, mode):
        with tempfile.TemporaryDirectory() as tmp:
            rc, out, losses = run(tmp, mode)
            self.assertEqual(rc, 0, out)
            self.assertIn("train-digits: PASS", out)
            survivors = [r for r in range(4) if r != KILLED]
            self.assertTrue(os.path.exists(os.path.join(losses, f"w{KILLED}.killed")), out)
            self.assertFalse(os.path.exists(os.path.join(losses, f"w{KILLED}.txt")), out)
            for r in survivors:
                curve = np.loadtxt(os.path.join(losses, f"w{r}.txt"))
                self.assertEqual(len(curve), EPOCHS * STEPS_PER_EPOCH, f"w{r}\n{out}")
            check_accuracy(self, losses, [f"w{r}" for r in survivors], out)
            self.assertIn(f"worker w{KILLED} (rank {KILLED}) stopped answering", out)
            self.assertIn("removed from the job, which goes on with 3 ranks", out)
            self.assertIn("workers removed: 1", out)  # the server's closing line
            self.assertIn("1 workers removed from the job", out)  # rank 0's counter
            lost = survivors_loss(losses, survivors)
            print(f"\n{mode}: the survivors' longest step after the kill took {lost:.3f} s "
                  f"more than their median one (peer timeout {TIMEOUT_MS / 1000:.1f} s)",
                  file=sys.stderr)
            self.assertLess(lost, BOUND_S, out)


if __name__ == "__main__":
    main("LostWorker")
