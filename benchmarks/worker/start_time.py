#!/usr/bin/python3
"""The time a Python trainer's mercury.Worker takes to build (EAL, the node's ports and
pools, the net core) in the two-worker memif job of pmd-tests/python (eal.hugepages: off,
4095 mbufs), with a ps-server running for its memif port. With several builds of the
extension module (--so FILE ...), each is copied over the build's own before its run,
interleaved, and the build's own is put back; medians and spread per file.

  start_time.py BUILD_DIR [--runs 5] [--so FILE FILE ...]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "pmd-tests", "python"))
from worker_api_test import JOB  # noqa: E402  (the two-worker memif job)

CHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
import mercury
t = time.monotonic()
w = mercury.Worker(sys.argv[2], "w0")
print("built", time.monotonic() - t, flush=True)
w.shutdown()
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--so", nargs="*", default=[])
    a = p.parse_args()
    if a.runs < 1:
        p.error("--runs must be positive")
    pkg = os.path.join(os.path.abspath(a.build), "lib", "python")
    own = [os.path.join(pkg, "mercury", f) for f in os.listdir(os.path.join(pkg, "mercury"))
           if f.startswith("_mercury") and f.endswith(".so")]
    if len(own) != 1:
        p.error(f"{pkg}/mercury: no single _mercury extension module (build first)")
    for f in a.so:
        if not os.path.isfile(f):
            p.error(f"{f}: no such file")
    saved = own[0] + ".start_time"
    variants = a.so or [own[0]]
    times = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(JOB.format(name="start", tmp=tmp))
        server = subprocess.Popen([os.path.join(a.build, "apps", "ps-server"), "--config", job,
                                   "--node", "server0"], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        shutil.copy(own[0], saved)
        try:
            time.sleep(2)  # its ports up
            env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(pkg, "mercury"))
            for run in range(a.runs):
                for v in variants:
                    if a.so:
                        shutil.copy(v, own[0])
                    r = subprocess.run([sys.executable, "-c", CHILD, pkg, job], env=env,
                                       capture_output=True, text=True, timeout=120)
                    line = [l for l in r.stdout.splitlines() if l.startswith("built ")]
                    if r.returncode != 0 or not line:
                        sys.exit(f"start_time: the worker did not build:\n{r.stdout}{r.stderr}")
                    times[v].append(float(line[0].split()[1]))
                    print(f"{os.path.basename(v)} run {run + 1}: {times[v][-1]:.3f} s", flush=True)
        finally:
            shutil.copy(saved, own[0])
            os.unlink(saved)
            server.terminate()
            server.wait(timeout=30)
    for v, t in times.items():
        print(f"{os.path.basename(v)}: {statistics.median(t):.3f} s [{min(t):.3f}, "
              f"{max(t):.3f}] (median [min, max] of {len(t)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
