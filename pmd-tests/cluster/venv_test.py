#!/usr/bin/python3
"""`pip install .` into a fresh virtual environment, offline (docs/cluster.md,
"Install"): a copy of the source tree is built by meson-python (Debian's
python3-mesonpy, --no-build-isolation --no-index, pyproject.toml's portable
build without tests or benchmarks) into a venv made with
--system-site-packages (Debian's numpy and torch). Then, from a directory
outside the tree, the venv's python imports mercury and mercury.torch from
the venv alone, the venv's ps-job writes a job file, the venv's ps-server
serves it, and one worker process does a push_pull whose result is checked
exactly (SGD: p - lr * g, in float32). The venv and the copy are removed at
the end, whatever happens.

Usage: venv_test.py SOURCE_DIR
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE = None


def copy_tree(src, dst):
    """The files git knows (tracked, or new and not ignored), else everything
    but build directories."""
    r = subprocess.run(["git", "-C", src, "ls-files", "-z", "--cached", "--others",
                        "--exclude-standard"], capture_output=True)
    if r.returncode == 0 and r.stdout:
        for rel in sorted(set(r.stdout.decode().split("\0")) - {""}):
            s = os.path.join(src, rel)
            if not os.path.isfile(s):
                continue  # deleted in the work tree
            d = os.path.join(dst, rel)
            os.makedirs(os.path.dirname(d), exist_ok=True)
            shutil.copy2(s, d)
    else:
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("build*", ".git"),
                        dirs_exist_ok=True)


PUSH_PULL = r"""
import os, sys
import numpy as np
import mercury, mercury.torch
venv = sys.argv[1]
assert mercury.__file__.startswith(venv), mercury.__file__
assert mercury.torch.__file__.startswith(venv), mercury.torch.__file__
job, node, how = mercury.identify()   # MERCURY_JOB and MERCURY_NODE
assert (node, how) == ("w0", "MERCURY_NODE=w0"), (node, how)
params = np.arange(5000, dtype=np.float32) * np.float32(0.25)
grad = (np.arange(5000) % 7 - 3).astype(np.float32)
want = params - np.float32(job.training["learning_rate"]) * grad
with mercury.Worker() as w:
    k = w.declare("p", params)
    w.push_pull(k, grad).wait()
    assert np.array_equal(params, want), "push_pull's result is not p - lr * g"
    w.barrier()
print("venv: push_pull exact from", os.path.dirname(mercury.__file__))
"""


class Venv(unittest.TestCase):
    def test_pip_install_into_a_venv(self):
        with tempfile.TemporaryDirectory(prefix="mercury-venv-") as tmp:
            src = os.path.join(tmp, "src")
            copy_tree(SOURCE, src)
            venv = os.path.join(tmp, "venv")
            subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv],
                           check=True, capture_output=True)
            r = subprocess.run([os.path.join(venv, "bin", "pip"), "install",
                                "--no-build-isolation", "--no-index", src],
                               capture_output=True, text=True, timeout=1500)
            self.assertEqual(r.returncode, 0, r.stdout[-4000:] + r.stderr[-4000:])
            bin_dir = os.path.join(venv, "bin")
            for app in ("ps-server", "ps-job", "ps-worker"):
                self.assertTrue(os.path.exists(os.path.join(bin_dir, app)), app)
            # The worker library for C and C++ trainers, bundled in the wheel.
            libs = [os.path.join(d, f) for d, _, files in os.walk(venv) for f in files
                    if f.startswith("libmercury-worker.so")]
            self.assertTrue(libs, "libmercury-worker.so is not in the venv")
            # A job of one server and one worker over memif, written by the venv's ps-job.
            job = os.path.join(tmp, "job.yaml")
            template = os.path.join(tmp, "template.yaml")
            with open(template, "w") as f:
                f.write('eal: {memory_mb: 512, hugepages: "off"}\n'
                        "training: {optimizer: sgd, learning_rate: 0.5}\n")
            subprocess.run([os.path.join(bin_dir, "ps-job"), "--hosts", "localhost", "--nic",
                            "memif", "--workers-per-host", "1", "--cpus", "2", "--template",
                            template, "--name", f"venv{os.getpid()}", "--memif-dir", tmp,
                            "--output", job, "--check"], check=True, capture_output=True)
            server = subprocess.Popen([os.path.join(bin_dir, "ps-server"), "--config", job],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            try:
                env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                env.update(MERCURY_JOB=job, MERCURY_NODE="w0")
                w = subprocess.run([os.path.join(bin_dir, "python"), "-c", PUSH_PULL, venv],
                                   capture_output=True, text=True, timeout=120, cwd=tmp, env=env)
                self.assertEqual(w.returncode, 0, w.stdout + w.stderr)
                self.assertIn("venv: push_pull exact from " + venv, w.stdout)
                self.assertEqual(server.wait(60), 0)
            finally:
                if server.poll() is None:
                    server.kill()
                    server.wait()
                server.stdout.close()
            print("\n" + w.stdout.strip() + "; the worker library in "
                  + os.path.relpath(os.path.dirname(libs[0]), venv), file=sys.stderr)


if __name__ == "__main__":
    SOURCE = os.path.abspath(sys.argv[1])
    try:
        import mesonpy  # noqa: F401  (Debian's python3-mesonpy)
    except ImportError:
        print("SKIP: no meson-python (Debian's python3-mesonpy)")
        sys.exit(77)
    unittest.main(argv=[sys.argv[0]], verbosity=2)
