#!/usr/bin/python3
"""A whole job in separate processes over net_memif: ps-server and four
ps-worker processes (config/memif.yaml, with sockets and the EAL file prefix
made unique to this run), 3 rounds of push_pull over MobileNet-v2's tensors.
The workers start first and the server 2 s later: their memif ports wait
for its sockets to listen. Every worker must report rank 0's initial
parameters exact and every aggregate of every round exact, and exit 0.
The server runs with --stay: once a port's worker has left, the server
detaches that memif port (it must say so for all four), and when w0 comes
back its port is attached again and the new w0 is refused (the job is
finished). The links come up while the server starts: it must map their
shared memory in (and say so). The server must stop cleanly on SIGINT.

  memif_job_test.py PS_SERVER PS_WORKER CONFIG_DIR
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROUNDS = 3


def main():
    ps_server, ps_worker, config_dir = sys.argv[1:4]
    with tempfile.TemporaryDirectory(prefix="wk-memif-") as tmp:
        text = open(os.path.join(config_dir, "memif.yaml")).read()
        text = text.replace("/tmp/mercury/", tmp + "/")
        text = re.sub(r"(\n  name:) memif", r"\1 wkmemif%d" % os.getpid(), text)
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(text)
        model = os.path.join(config_dir, "models", "mobilenet_v2.txt")
        # The workers first: each one's memif client waits for the server's
        # socket (up to its start timeout, 30 s); the server comes 2 s later.
        workers = [subprocess.Popen([ps_worker, "--config", job, "--node", "w%d" % r,
                                     "--model", model, "--rounds", str(ROUNDS)],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                   for r in range(4)]
        time.sleep(2.0)
        server = subprocess.Popen([ps_server, "--config", job, "--seconds", "100", "--stay"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        failed = False
        for r, w in enumerate(workers):
            try:
                out, _ = w.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                w.kill()
                out, _ = w.communicate()
                print("w%d timed out" % r)
                failed = True
            print(out, end="")
            exact = len(re.findall(r"round +\d+: .* every aggregate exact", out))
            if w.returncode != 0 or "initial parameters exact" not in out or exact != ROUNDS:
                print("w%d: exit %d, %d of %d rounds exact" % (r, w.returncode, exact, ROUNDS))
                failed = True
        # A worker of the finished job again: its port, detached when the first
        # w0 left, must be polled again for the refusal to reach it.
        again = subprocess.run([ps_worker, "--config", job, "--node", "w0", "--model", model,
                                "--rounds", str(ROUNDS)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=60)
        print(again.stdout[-1500:], end="")
        if again.returncode == 0 or "the job is finished" not in again.stdout:
            print("w0 again: exit %d, not refused as the job is finished" % again.returncode)
            failed = True
        time.sleep(1.5)  # the server's report thread looks every 10 ms, its net core every 100
        server.send_signal(signal.SIGINT)
        try:
            out, _ = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            out, _ = server.communicate()
            print("ps-server did not stop on SIGINT")
            failed = True
        print(out[-2000:], end="")
        detached = re.findall(r"port (net_memif\d+): every worker behind it left; detached", out)
        attached = re.findall(r"port (net_memif\d+): a new peer connected; attached again", out)
        if sorted(detached) != ["net_memif%d" % p for p in range(4)]:
            print("ps-server detached %s, not each of its four ports once" % detached)
            failed = True
        if attached != ["net_memif0"]:
            print("ps-server attached %s again, not w0's port net_memif0" % attached)
            failed = True
        # The four links came up while the server was starting (its workers
        # waited for it): their shared memory must still be mapped in before
        # the job's frames fault it in on the net core, and said.
        mapped = [float(mb) for mb in re.findall(
            r"mapped in the shared memory of the connected net_memif links \(([\d.]+) MB\)", out)]
        print("ps-server mapped in net_memif shared memory: %s MB" % mapped)
        if not mapped or max(mapped) <= 0:
            print("ps-server never mapped its links' shared memory in")
            failed = True
        if server.returncode != 0:
            print("ps-server exit %d" % server.returncode)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
