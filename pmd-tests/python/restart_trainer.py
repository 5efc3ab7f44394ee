#!/usr/bin/python3
"""The trainer of launch_restart_test.py, one worker of an asp job started by
`python3 -m mercury.launch --max-restarts 2`: two float32 tensors, STEPS push_pulls
of a gradient of ones each, 20 ms apart, then a barrier.

Rank 2 misbehaves by process: its first one (no MERCURY_RESTART) kills itself
(SIGKILL) after KILL_AFTER steps; its second declares a tensor list that differs
from the job's, so the servers refuse it (it prints the error and exits with status
3); its third joins, checks the step it joined at (the slowest rank's, no earlier than
the kill) and that its buffers hold the newest versions (at least the others' steps
before the kill made), and trains the rest of the steps from that step.

Usage: restart_trainer.py (MERCURY_JOB and MERCURY_NODE from the launcher)
"""
import os
import signal
import sys
import time

import numpy as np

import mercury

STEPS = 400  # about 10 s: the others are still training when the third process joins
KILL_AFTER = 10
SIZES = (50_000, 3_000)


def main():
    restart = int(os.environ.get("MERCURY_RESTART", "0"))
    w = mercury.Worker()
    odd = w.rank == 2 and restart == 1
    params = [np.zeros(n + (1 if odd and k == 1 else 0), np.float32)
              for k, n in enumerate(SIZES)]
    grads = [np.ones_like(p) for p in params]
    keys = [w.declare(f"t{k}", p) for k, p in enumerate(params)]
    try:
        w.start()
    except mercury.WorkerError as e:
        print(f"w{w.rank} (restart {restart}): start failed: {e}", flush=True)
        return 3
    joined = w.joined_version
    first = 0
    if joined is not None:
        # The slowest rank had trained past the kill; every chunk had at least one
        # update per step of the three ranks that went on.
        versions = [w.version(k) for k in keys]
        print(f"w{w.rank} (restart {restart}): joined the running job at step {joined}; "
              f"its tensors hold versions {versions}", flush=True)
        if joined < KILL_AFTER or min(versions) < 3 * KILL_AFTER:
            print("restart_trainer: FAIL: the first pull is older than the join", flush=True)
            return 1
        first = joined
    for step in range(first, STEPS):
        hs = [w.push_pull(k, g, p) for k, g, p in zip(keys, grads, params)]
        for h in hs:
            h.wait()
        if w.rank == 2 and restart == 0 and step + 1 == KILL_AFTER:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.02)
    w.barrier()
    s = w.stats()
    print(f"w{w.rank} (restart {restart}): done, {s['pushes']} pushes, "
          f"{s['workers_removed']} removed, {s['workers_joined']} joined", flush=True)
    w.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
