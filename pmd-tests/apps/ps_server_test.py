#!/usr/bin/python3
"""ps-server as an operator runs it: --check, refusals, the stats line,
telemetry over DPDK's socket, a clean stop on SIGTERM, and the end of a job
(every worker left: exit 0 by itself; the job refused: exit 2; --stay: on
until a signal), with ps-worker processes over net_memif, and clients that
close their memif connection before the server greets them.

Usage: ps_server_test.py PS_SERVER_BINARY CONFIG_DIR
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

PS_SERVER = None
CONFIG_DIR = None


def memif_job(tmp, name, training=""):
    """config/memif.yaml with its sockets in `tmp` and its own job name, so
    that runs never share sockets or EAL runtime directories; `training`:
    lines added to its training section."""
    with open(os.path.join(CONFIG_DIR, "memif.yaml")) as f:
        text = f.read()
    text = text.replace("/tmp/mercury/", tmp + "/").replace("name: memif", "name: " + name)
    text = text.replace("training:\n", "training:\n" + training, 1)
    path = os.path.join(tmp, "job.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def run(*args, timeout=60):
    return subprocess.run([PS_SERVER, *args], capture_output=True, text=True, timeout=timeout)


class Check(unittest.TestCase):
    def test_check_prints_what_would_run(self):
        r = run("--config", os.path.join(CONFIG_DIR, "memif.yaml"), "--check")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("ok: server server0 (rank 0 of 1), shards 0..1 of 2, 4 workers", r.stdout)
        self.assertIn("--vdev=net_memif0,role=server", r.stdout)

    def test_a_worker_node_is_refused(self):
        r = run("--config", os.path.join(CONFIG_DIR, "memif.yaml"), "--node", "w0")
        self.assertEqual(r.returncode, 1)
        self.assertIn("node w0 is a worker, not a server", r.stderr)

    def test_an_unknown_node_is_refused(self):
        r = run("--config", os.path.join(CONFIG_DIR, "memif.yaml"), "--node", "nobody")
        self.assertEqual(r.returncode, 1)
        self.assertIn("nobody", r.stderr)

    def test_a_bad_job_file_names_file_line_and_key(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = memif_job(tmp, "bad")
            with open(path) as f:
                text = f.read()
            with open(path, "w") as f:
                f.write(text.replace("  mtu: 9000", "  mtuu: 9000", 1))
            r = run("--config", path, "--check")
            self.assertEqual(r.returncode, 1)
            self.assertRegex(r.stderr, r"job\.yaml:\d+: network\.mtuu")

    def test_bad_arguments_are_refused(self):
        env = {k: v for k, v in os.environ.items() if k != "MERCURY_JOB"}
        self.assertIn("no job file: give its path (--config, the job argument) or set "
                      "MERCURY_JOB",
                      subprocess.run([PS_SERVER], capture_output=True, text=True,
                                     env=env).stderr)
        r = run("--config", os.path.join(CONFIG_DIR, "memif.yaml"), "--seconds", "abc")
        self.assertEqual(r.returncode, 1)
        self.assertIn("--seconds wants a positive number, not 'abc'", r.stderr)
        self.assertIn("unknown argument --frobnicate", run("--frobnicate").stderr)


class Run(unittest.TestCase):
    def test_stats_telemetry_and_sigterm(self):
        with tempfile.TemporaryDirectory() as tmp:
            name = "pss%d" % os.getpid()
            job = memif_job(tmp, name)
            p = subprocess.Popen([PS_SERVER, "--config", job], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
            try:
                lines = []
                deadline = time.time() + 60
                while time.time() < deadline:
                    line = p.stdout.readline()
                    if not line:
                        break
                    lines.append(line)
                    if "] waiting" in line:
                        break
                out = "".join(lines)
                self.assertIn("lcore 0 (cpu", out)
                self.assertIn("shard 0", out)
                self.assertIn("net_memif3", out)
                self.assertRegex(out, r"\] waiting  pkts in \d+/s out \d+/s  aggregations 0/s")
                tool = shutil.which("dpdk-telemetry.py")
                if tool:
                    q = subprocess.run([tool, "-f", name + "-server0"], input="/mercury/stats\n",
                                       capture_output=True, text=True, timeout=30)
                    start = q.stdout.find("{")
                    self.assertGreaterEqual(start, 0, q.stdout + q.stderr)
                    stats = json.loads(q.stdout[start:].splitlines()[0])["/mercury/stats"]
                    self.assertIn("aggregations", stats["server"])
                    self.assertIn("drop_not_running", stats["server"])
                    self.assertIn("rx_frames", stats["port0"])
                p.send_signal(signal.SIGTERM)
                rest, _ = p.communicate(timeout=30)
                self.assertEqual(p.returncode, 0, rest)
                self.assertIn("ps-server server0: stopped", rest)
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                shutil.rmtree("/var/run/dpdk/" + name + "-server0", ignore_errors=True)


class JobEnd(unittest.TestCase):
    """config/memif.yaml's 4 workers, as ps-worker processes (one round of
    MobileNetV2), against ps-server without a signal."""

    def run_job(self, tag, stay, models, training="", poke=0):
        """`poke`: connections to each worker's memif socket, each closed at
        once, before the workers start; returns, with the rest, ps-server's
        open descriptors before and 2 s after them."""
        worker_bin = os.path.join(os.path.dirname(PS_SERVER), "ps-worker", "ps-worker")
        with tempfile.TemporaryDirectory() as tmp:
            name = "psend%s%d" % (tag, os.getpid())
            job = memif_job(tmp, name, training)
            p = subprocess.Popen([PS_SERVER, "--config", job] + (["--stay"] if stay else []),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            workers = []
            head = ""
            try:
                line = ""
                while "] waiting" not in line:  # the start lines, then the first stats line
                    self.assertIsNone(p.poll(), "ps-server exited before serving")
                    line = p.stdout.readline()
                    head += line
                fds = len(os.listdir("/proc/%d/fd" % p.pid))
                for _ in range(poke):
                    for w in range(len(models)):
                        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                        try:
                            s.connect("\0" + os.path.join(tmp, "w%d.sock" % w))
                        except ConnectionRefusedError:
                            self.fail("ps-server stopped listening:\n" + head +
                                      p.communicate(timeout=30)[0])
                        finally:
                            s.close()
                if poke:
                    time.sleep(2)
                fds = (fds, len(os.listdir("/proc/%d/fd" % p.pid)))
                for w, model in enumerate(models):
                    workers.append(subprocess.Popen(
                        [worker_bin, "--config", job, "--node", "w%d" % w, "--model",
                         os.path.join(CONFIG_DIR, "models", model), "--rounds", "1"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                status = [w.wait(timeout=120) for w in workers]
                try:
                    rest, _ = p.communicate(timeout=15)
                    ended = True
                except subprocess.TimeoutExpired:
                    ended = False
                if stay:
                    self.assertFalse(ended, "ps-server --stay exited by itself")
                    p.send_signal(signal.SIGTERM)
                    rest, _ = p.communicate(timeout=30)
                self.fds = fds
                return status, p.returncode, head + rest
            finally:
                for w in workers:
                    if w.poll() is None:
                        w.kill()
                if p.poll() is None:
                    p.kill()
                    p.wait()
                shutil.rmtree("/var/run/dpdk/" + name + "-server0", ignore_errors=True)

    def test_every_worker_leaving_ends_the_server(self):
        status, rc, out = self.run_job("f", False, ["mobilenet_v2.txt"] * 4)
        self.assertEqual(status, [0, 0, 0, 0])
        self.assertEqual(rc, 0, out)
        # Said once even when the job starts and ends between two looks at the state.
        self.assertEqual(out.count("every worker declared;"), 1, out)
        self.assertIn("every worker left; the job is done", out)
        self.assertIn("ps-server server0: stopped", out)

    def test_clients_that_close_before_their_greeting_leave_the_server_serving(self):
        # DPDK 22.11's memif server died of this (memif_server_send.cpp, docs/net.md).
        status, rc, out = self.run_job("p", False, ["mobilenet_v2.txt"] * 4, poke=20)
        self.assertEqual(status, [0, 0, 0, 0], out)
        self.assertEqual(rc, 0, out)
        self.assertNotIn("PANIC", out)
        self.assertIn("every worker left; the job is done", out)
        self.assertEqual(self.fds[1], self.fds[0], "descriptors left open by the closed clients")

    def test_every_executable_that_can_host_a_memif_server_exports_its_sendmsg(self):
        # The PMD calls the executable's sendmsg() only if it is exported (lib/net/meson.build);
        # the test above runs ps-server's, and ps-demo and ps-worker link the same file.
        apps = os.path.dirname(PS_SERVER)
        for exe in ["ps-server", "ps-demo", os.path.join("ps-worker", "ps-worker")]:
            table = subprocess.run(["nm", "-D", "--defined-only", os.path.join(apps, exe)],
                                   capture_output=True, text=True, check=True).stdout
            names = {line.split()[-1] for line in table.splitlines() if line.strip()}
            self.assertTrue("sendmsg" in names, exe + " does not export sendmsg()")

    def test_a_refused_job_ends_the_server_with_status_2(self):
        status, rc, out = self.run_job("r", False, ["mobilenet_v2.txt"] * 3 + ["alexnet.txt"])
        self.assertTrue(all(s != 0 for s in status), status)
        self.assertEqual(rc, 2, out)
        self.assertIn("the job cannot start", out)
        self.assertNotIn("every worker declared;", out)
        self.assertIn("ps-server server0: stopped", out)

    def test_a_store_and_forward_job_says_so_and_stays_exact(self):
        # The classical PS's baseline: every ps-worker checks every aggregate.
        status, rc, out = self.run_job("t", False, ["mobilenet_v2.txt"] * 4,
                                       "  aggregation: tensor\n")
        self.assertEqual(status, [0, 0, 0, 0], out)
        self.assertEqual(rc, 0, out)
        self.assertIn("bsp, store-and-forward (training.aggregation: tensor, a baseline)", out)
        self.assertIn("every worker left; the job is done", out)

    def test_stay_keeps_serving_after_the_end(self):
        status, rc, out = self.run_job("s", True, ["mobilenet_v2.txt"] * 4)
        self.assertEqual(status, [0, 0, 0, 0])
        self.assertEqual(rc, 0, out)
        self.assertIn("every worker left; the job is done", out)


if __name__ == "__main__":
    PS_SERVER, CONFIG_DIR = sys.argv[1], sys.argv[2]
    unittest.main(argv=[sys.argv[0], "-v"])
