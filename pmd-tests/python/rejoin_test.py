#!/usr/bin/python3
"""A restarted worker joins a running asynchronous job (docs/membership.md, "Joining"):
the digits CNN (apps/train-digits) trained by 4 worker processes and ps-server over
net_memif under asp, ssp and psplus, rank 2 killed (SIGKILL) right after the backward pass
of its step KILL_STEP, and started again by the launcher (--max-restarts 1).

Per mode, checked: the launcher says it started w2 again; the new process joins the
running job at the step the slowest rank had reached, no earlier than the steps every other
rank had completed when w2 was killed (its
first pull is every chunk's newest version, not version 0), and goes on from that step
to the end of its epochs, so that every rank ends at the same step (under ssp a rank
that ended more than the bound apart from the others would hold them for ever); the job finishes with 4 ranks
(every process's status 0, the server's 0) and its ranks' final test accuracy (their mean
at least 0.9, each at least 0.8); the server names the removal and the join and counts one of each in
its closing line, and rank 0 counts one worker joined.

Usage: rejoin_test.py BUILD_DIR [MODE ...]
"""
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import membership_test as lost  # noqa: E402  (its job files, run() and constants)

class RestartedWorker(lost.EveryMode, unittest.TestCase):
    def check(self, mode):
        with tempfile.TemporaryDirectory() as tmp:
            rc, out, losses = lost.run(tmp, mode, extra=("--max-restarts", "1"))
            self.assertEqual(rc, 0, out)
            self.assertIn("train-digits: PASS", out)
            w = f"w{lost.KILLED}"
            self.assertIn(f"launch: {w} exited with status -9; starting it again "
                          "(restart 1 of 1)", out)
            lost.check_joined(self, out, losses, w)
            lost.check_accuracy(self, losses, [f"w{r}" for r in range(4)], out)
            self.assertIn(f"worker {w} (rank {lost.KILLED}) joined the running job (a new "
                          "process): it goes on with 4 ranks", out)
            self.assertIn("workers removed: 1; workers joined: 1", out)  # the server's line
            self.assertIn("1 workers joined the job", out)  # rank 0's counter


if __name__ == "__main__":
    lost.main("RestartedWorker")
