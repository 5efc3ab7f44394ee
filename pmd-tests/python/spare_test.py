#!/usr/bin/python3
"""A spare worker takes a lost rank over (docs/membership.md, "Spare workers"): the
digits CNN (apps/train-digits) trained by 4 ranks and ps-server over net_memif, with a
fifth worker node w4 that the job file marks `spare: true`, under asp and psplus (and
ssp). The launcher starts w4 with the ranks; it announces itself to the server and
waits. Rank 2 is killed (SIGKILL) right after the backward pass of its step KILL_STEP
and not started again: once the server has removed it and the grace
(training.spare_grace_s) has passed, w4 takes rank 2 over.

Per mode, checked: the server says "spare w4 took over worker w2 (rank 2)", counts one
worker removed and one joined, a spare's, in its closing line, and rank 0 counts one
worker joined; w4 says it took over rank 2 and joined at a step no earlier than the
steps every other rank had completed at the kill, then trains rank 2's batches from that step to the end of the epochs; the ranks
0, 1 and 3 train every step; the job finishes with 4 ranks (every process's status 0,
w4's included) and its ranks' final test accuracy (their mean at least 0.9, each at
least 0.8). And a
job that needs no spare (no kill, 2 epochs, asp) releases w4 at its end: w4 says it was
released and exits with status 0, the server counts it.

Usage: spare_test.py BUILD_DIR [MODE ... | released]
"""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import digits_test  # noqa: E402
import membership_test as lost  # noqa: E402  (its job files, run() and constants)

GRACE_S = 1.0


def spare_job_file(tmp, mode):
    """membership_test's job file with a fifth worker node, w4, a spare: its own memif
    socket, the server's fifth port (a spare's port comes after the ranks')."""
    path = lost.job_file(tmp, mode)
    with open(path) as f:
        text = f.read()
    port = "      - net_memif3,role=server,id=0,socket={d}/digits-w3.sock,bsize=9216\n"
    port = port.format(d=tmp)
    assert port in text, text
    text = text.replace(port, port + port.replace("memif3", "memif4").replace("w3", "w4"))
    text = text.replace("training:\n", f"training:\n  spare_grace_s: {GRACE_S}\n", 1)
    text += ("\n  - name: w4\n    role: worker\n    spare: true\n    ipv4: 10.0.0.15\n"
             "    mac: 02:00:00:00:00:15\n"
             f"    ports: [ \"net_memif14,role=client,id=0,socket={tmp}/digits-w4.sock,"
             "bsize=9216\" ]\n    lcores: [6]\n")
    with open(path, "w") as f:
        f.write(text)
    return path


class SpareWorker(lost.EveryMode, unittest.TestCase):
    def check(self, mode):
        with tempfile.TemporaryDirectory() as tmp:
            path = spare_job_file(tmp, mode)
            rc, out, losses = lost.run(tmp, mode, job=path)
            self.assertEqual(rc, 0, out)
            self.assertIn("train-digits: PASS", out)
            self.assertIn(f"spare w4 took over worker w{lost.KILLED} (rank {lost.KILLED}): it goes "
                          "on with 4 ranks", out)
            self.assertIn(f"w4: spare, took over rank {lost.KILLED}", out)
            # It trained rank 2's batches from the step it joined at to the end.
            lost.check_joined(self, out, losses, "w4")
            self.assertFalse(os.path.exists(os.path.join(losses, f"w{lost.KILLED}.txt")), out)
            lost.check_accuracy(self, losses, ["w0", "w1", "w3", "w4"], out)
            # The server's closing line, and rank 0's counter.
            self.assertIn("workers removed: 1; workers joined: 1 (spares: 1)", out)
            self.assertIn("1 workers joined the job", out)

    def test_released(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = spare_job_file(tmp, "asp")
            r = subprocess.run([sys.executable, digits_test.SCRIPT, "--job", path, "--epochs",
                                "2", "--build", lost.BUILD, "--compute-ms", "10", "--target", "0"],
                               capture_output=True, text=True, timeout=300)
            out = r.stdout + r.stderr
            self.assertEqual(r.returncode, 0, out)  # w4's status 0 included
            self.assertIn("w4: released: server server0 (10.0.0.1:47100) released this spare: "
                          "server: the job is finished (every rank left or was removed): spare w4 "
                          "was not needed", out)
            self.assertIn("spares released: 1", out)  # the server's closing line
            self.assertNotIn("took over", out)


if __name__ == "__main__":
    lost.main("SpareWorker")  # a mode, or "released"
