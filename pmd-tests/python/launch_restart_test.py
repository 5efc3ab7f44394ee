#!/usr/bin/python3
"""`python3 -m mercury.launch --max-restarts K` (docs/membership.md, "Launching"): the
launcher's own command line, a plain numpy trainer (restart_trainer.py) in 4 worker
processes and ps-server over net_memif, asp. Rank 2's first process kills itself
(SIGKILL) mid-job; the launcher starts it again; the new process declares another tensor
list and is refused alone (the job goes on); the launcher starts it a second time and
that process joins with at least the versions of the join, trains on and leaves with
the others. Checked: both restart lines, the refusal's text, the join, every process's
status 0 in the end (the launcher's) and the server's closing counts.

Usage: launch_restart_test.py BUILD_DIR
"""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import digits_test  # noqa: E402
import membership_test as lost  # noqa: E402

BUILD = None


class LaunchRestarts(unittest.TestCase):
    def test_a_killed_worker_is_started_again_and_joins(self):
        with tempfile.TemporaryDirectory() as tmp:
            job = lost.job_file(tmp, "asp")
            env = dict(os.environ)
            env["PYTHONPATH"] = os.path.join(BUILD, "lib", "python")
            r = subprocess.run([sys.executable, "-m", "mercury.launch", "--job", job,
                                "--server", os.path.join(BUILD, "apps", "ps-server"),
                                "--max-restarts", "2", "--timeout", "300", "--",
                                os.path.join(HERE, "restart_trainer.py")],
                               capture_output=True, text=True, timeout=400, env=env)
            out = r.stdout + r.stderr
            self.assertEqual(r.returncode, 0, out)
            self.assertIn("launch: w2 exited with status -9; starting it again (restart 1 of 2)",
                          out)
            self.assertIn("launch: w2 exited with status 3; starting it again (restart 2 of 2)",
                          out)
            self.assertIn("w2 (restart 1): start failed: ", out)
            self.assertIn("cannot join the running job: its tensor list differs from the "
                          "job's", out)
            self.assertIn("w2 (restart 2): joined the running job at step", out)
            self.assertIn("worker w2 (rank 2) joined the running job (a new process): it goes "
                          "on with 4 ranks", out)
            for rank in (0, 1, 3):
                self.assertIn(f"w{rank} (restart 0): done", out)
            self.assertIn("w2 (restart 2): done", out)
            self.assertIn("workers removed: 1; workers joined: 1", out)  # the server's line
            self.assertNotIn("FAIL", out)


if __name__ == "__main__":
    BUILD = os.path.abspath(sys.argv[1])
    lost.BUILD = digits_test.BUILD = BUILD
    unittest.main(argv=[sys.argv[0]], verbosity=2)
