#!/usr/bin/python3
"""The digits job under torchrun (docs/cluster.md): ps-server started apart,
then

    torchrun --standalone --nproc_per_node=4 apps/train-digits/train_digits.py --job JOB

whose 4 processes carry no Mercury argument but the job file: each is the
worker its RANK of WORLD_SIZE=4 maps to (the launcher started the job's
workers alone). Every worker's loss at every step must be the one-process
reference's (train_digits.py --single --exact) bit for bit.

Debian 12's torchrun (torch 1.13 on Python 3.11) spells the option
--nproc_per_node (torch 2 takes --nproc-per-node too), and fails at start
with "'NoneType' object has no attribute 'get'" unless --redirects and --tee
are 1 or 2 (its Std.from_str finds no member for 0 or 3 on Python 3.11's
IntFlag): the test runs it with --redirects 2 --tee 1 (stderr to the log
directory, stdout to the log and the console), as docs/cluster.md says.

Usage: torchrun_test.py BUILD_DIR
"""
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from digits_job import EPOCHS, SCRIPT, exact_losses, job_file, losses

BUILD = None
WORKERS = 4


def torchrun():
    """Debian's torchrun (python3-torch), or the module it runs."""
    if os.path.exists("/usr/bin/torchrun"):
        return ["/usr/bin/torchrun"]
    return [sys.executable, "-m", "torch.distributed.run"]


class Torchrun(unittest.TestCase):
    def test_torchrun_trains_beside_a_ps_server(self):
        with tempfile.TemporaryDirectory(prefix="mercury-torchrun-") as tmp:
            job = job_file(os.path.join(tmp, "digits.yaml"), name=f"torchrun{os.getpid()}",
                           sockets=tmp)
            got_dir = os.path.join(tmp, "losses")
            log = open(os.path.join(tmp, "server.log"), "w+")
            server = subprocess.Popen([os.path.join(BUILD, "apps", "ps-server"), "--config", job],
                                      stdout=log, stderr=subprocess.STDOUT)
            try:
                env = {k: v for k, v in os.environ.items()
                       if k not in ("MERCURY_JOB", "MERCURY_NODE")}
                logs = os.path.join(tmp, "torchrun-logs")
                r = subprocess.run(
                    [*torchrun(), "--standalone", "--nproc_per_node=4", "--redirects", "2", "--tee",
                     "1", "--log_dir", logs, SCRIPT, "--job", job, "--epochs", str(EPOCHS),
                     "--target", "0", "--losses", got_dir, "--build", BUILD],
                    capture_output=True, text=True, timeout=400, env=env)
                out = r.stdout + r.stderr
                for base, _, files in os.walk(logs):
                    for name in sorted(files):
                        with open(os.path.join(base, name), errors="replace") as f:
                            out += f"\n== {name}\n" + f.read()
                self.assertEqual(r.returncode, 0, out)
                # Every worker gone, the server ends the job by itself.
                self.assertEqual(server.wait(60), 0)
            finally:
                if server.poll() is None:
                    server.kill()
                    server.wait()
                log.seek(0)
                server_out = log.read()
                log.close()
            for rank in range(WORKERS):
                self.assertIn(f"train-digits: worker w{rank} of {job} (RANK={rank} of "
                              "WORLD_SIZE=4)", out)
            self.assertIn("every worker left; the job is done", server_out)
            want = exact_losses(BUILD, job, os.path.join(tmp, "exact"), WORKERS)
            got = losses(got_dir, WORKERS)
            for rank in range(WORKERS):
                self.assertEqual(len(got[rank]), len(want[rank]), out)
                self.assertTrue(np.array_equal(got[rank], want[rank]),
                                f"w{rank}'s losses differ from the reference's\n{out}")
            stopped = [line for line in server_out.splitlines() if ": stopped; " in line]
            print(f"\ntorchrun --nproc_per_node=4: {WORKERS} workers x {len(want[0])} steps, every "
                  f"loss bit for bit the reference's; {stopped[-1] if stopped else ''}",
                  file=sys.stderr)


if __name__ == "__main__":
    BUILD = os.path.abspath(sys.argv[1])
    unittest.main(argv=[sys.argv[0]], verbosity=2)
