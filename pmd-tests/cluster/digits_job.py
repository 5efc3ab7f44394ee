"""The digits job (apps/train-digits) as the cluster tests run it: its job
file for a test, and the one-process reference every worker's losses are
compared with."""
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "apps", "train-digits", "train_digits.py")
EPOCHS = 3


def job_file(path, name=None, sockets=None, mtu=None, training=None, peer_timeout_ms=None):
    """config/digits.yaml written to `path` for a test: no hugepages (--no-huge
    -m 512), and optionally its own job name (EAL file prefixes), its memif
    sockets under `sockets`, another MTU (with a peer timeout for CPUs
    shared by namespaces), another training section (its lines, in place of
    digits.yaml's bsp and momentum) and another peer timeout."""
    with open(os.path.join(ROOT, "config", "digits.yaml")) as f:
        text = f.read()
    text = text.replace("memory_mb: 256", "memory_mb: 512").replace("hugepages: auto",
                                                                   'hugepages: "off"')
    if name:
        text = text.replace("name: digits", "name: " + name)
    if sockets:
        text = text.replace("/tmp/mercury/", sockets + "/")
    if mtu or peer_timeout_ms:
        text = text.replace("mtu: 9000", f"mtu: {mtu or 9000}\n"
                            f"  peer_timeout_ms: {peer_timeout_ms or 20000}")
    if training:
        head = ("training:\n  sync: bsp\n  optimizer: momentum\n  learning_rate: 0.1\n"
                "  momentum: 0.9\n")
        assert head in text, text
        text = text.replace(head, "training:\n" + "".join(f"  {line}\n" for line in training))
    with open(path, "w") as f:
        f.write(text)
    return path


def losses(directory, workers):
    """Each worker's per-step losses, as train_digits.py --losses wrote them."""
    return [np.loadtxt(os.path.join(directory, f"w{r}.txt")) for r in range(workers)]


def exact_losses(build, job, out, workers):
    """The one-process reference (train_digits.py --single --exact): the job's
    arithmetic, each worker's losses."""
    r = subprocess.run([sys.executable, SCRIPT, "--job", job, "--single", "--exact", "--epochs",
                        str(EPOCHS), "--losses", out, "--build", build, "--target", "0"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise AssertionError(r.stdout + r.stderr)
    return losses(out, workers)
