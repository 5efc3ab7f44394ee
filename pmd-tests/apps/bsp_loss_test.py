#!/usr/bin/python3
"""A lost worker in a BSP job, by policy (training.on_worker_loss, docs/membership.md), in
processes: ps-server and four ps-workers over net_memif, BSP with momentum, the link
emulator losing 2 % of the frames on every TX queue.

* `shrink`: on_worker_loss shrink. Rank 2 kills itself (SIGKILL, ps-worker --lose) in
  round LOSE_ROUND once the server took its gradients of the first LOSE_AFTER tensors it
  pushes. The server names it lost and removes it; the job finishes on 3 ranks. Every
  survivor checks every round bit for bit against the documented average: the rounds
  before over 4 ranks, in the round of the loss the tensors rank 2 pushed over 4 and the
  others over 3, every later round over 3 (ps-worker's reference, momentum's state
  replayed). The server ends with status 0 and counts one worker removed; each survivor
  prints the server's line on the removal.
* `wait`: on_worker_loss wait. Rank 2 kills itself the same way, and the test starts a
  new ps-worker for it as soon as it is gone. The server waits for it (the round holds),
  takes it back at the round in progress (version LOSE_ROUND - 1: its first pull is that
  version of every chunk, from the copies the server keeps), and the new process
  replays the unbroken run to that version, checks its parameters bit for bit and
  pushes the round's gradients again (the server ignores those it had). Every rank, the
  new process included, checks every round bit for bit against the unbroken run; the
  job finishes with 4 ranks; the server counts one worker joined.

  bsp_loss_test.py BUILD_DIR [shrink|wait ...]
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import scenarios  # noqa: E402
from memif_nodes import memif_nodes  # noqa: E402
from outputs import output  # noqa: E402

MODEL = "a 20000 100x200\nb 300 300\nc 7000 7000\nd 64 64\n"
TIMEOUT_S = 120
ROUNDS = 12
LOST = 2
LOSE_ROUND = 5
LOSE_AFTER = 2
# network.peer_timeout_ms: twice the default, as the other membership tests on this
# shared 2-CPU machine (a process can get no CPU for a second or more under load).
TIMEOUT_MS = 3000


def job_text(tag, tmp, policy):
    y = ["job: {id: 45, name: %s}" % tag,
         "network: {mtu: 1500, peer_timeout_ms: %d}" % TIMEOUT_MS,
         "mempool: {mbufs: 4095, cache: 64}",
         "eal: {memory_mb: 256, hugepages: off}",
         "training: {sync: bsp, optimizer: momentum, learning_rate: 0.01, momentum: 0.9,"
         " on_worker_loss: %s}" % policy,
         "link: {loss: 0.02, seed: 13}"]
    y += memif_nodes(4, lambda w: "%s/w%d.sock" % (tmp, w), "[0, 1]", lambda w: 2 + w)
    return "\n".join(y) + "\n"


def expect(cond, what, outputs=()):
    if cond:
        return None
    text = "\n".join("--- %s, status %s\n%s" % (n, s, t) for n, s, t in outputs)
    return what + ("\n" + text if text else "")


def run_job(build, tmp, policy, worker_args, restart=False):
    """ps-server and four ps-workers; [(name, status, output)], server first. With
    `restart`, a new process of rank LOST (without worker_args) is started once the first
    one has exited, and its output is appended as "w%d again" % LOST."""
    model = os.path.join(tmp, "model.txt")
    with open(model, "w") as f:
        f.write(MODEL)
    job = os.path.join(tmp, "job.yaml")
    with open(job, "w") as f:
        f.write(job_text("bl%d" % (os.getpid() % 100000), tmp, policy))
    procs = [("s0", subprocess.Popen(
        [os.path.join(build, "apps/ps-server"), "--config", job, "--node", "s0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))]

    def worker(w, args):
        return subprocess.Popen(
            [os.path.join(build, "apps/ps-worker/ps-worker"), "--config", job, "--node",
             "w%d" % w, "--model", model, "--rounds", str(ROUNDS)] + args,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for w in range(4):
        procs.append(("w%d" % w, worker(w, worker_args)))
    out = []
    try:
        if restart:
            first = procs[1 + LOST][1]
            try:
                first.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
            if first.returncode is not None:
                procs.append(("w%d again" % LOST, worker(LOST, [])))
        for name, p in procs:
            out.append((name,) + output(p, TIMEOUT_S))
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def scenario_shrink(build, tmp):
    out = run_job(build, tmp, "shrink", ["--lose", "%d,%d,%d" % (LOST, LOSE_ROUND, LOSE_AFTER)])
    server = out[0]
    survivors = [o for o in out[1:] if o[0] != "w%d" % LOST]
    lost = out[1 + LOST]
    err = expect(server[1] == 0 and all(s == 0 for _, s, _ in survivors),
                 "the server and the survivors end with status 0", out)
    err = err or expect(lost[1] == -9 and "killing itself (SIGKILL)" in lost[2],
                        "w%d killed itself in round %d" % (LOST, LOSE_ROUND), out)
    for name, _, text in survivors:
        exact = [int(r) for r in re.findall(r"round +(\d+): .* every aggregate exact", text)]
        err = err or expect(exact == list(range(1, ROUNDS + 1)) and
                            "done, %d rounds in" % ROUNDS in text,
                            "%s: every round exact (%s)" % (name, exact[-3:]), out)
        err = err or expect(re.search(r"worker w%d \(rank %d\) stopped answering .*removed from "
                                      r"the job, which goes on with 3 ranks" % (LOST, LOST),
                                      text) is not None,
                            "%s prints the server's line on the removal" % name, out)
    err = err or expect("removed from the job, which goes on with 3 ranks" in server[2] and
                        "workers removed: 1" in server[2],
                        "the server names the removal and counts it", out)
    if err:
        return err
    print("shrink: w%d lost in round %d after %d tensors; %d rounds exact on 3 ranks" %
          (LOST, LOSE_ROUND, LOSE_AFTER, ROUNDS))
    return None


def scenario_wait(build, tmp):
    out = run_job(build, tmp, "wait", ["--lose", "%d,%d,%d" % (LOST, LOSE_ROUND, LOSE_AFTER)],
                  restart=True)
    server = out[0]
    lost = out[1 + LOST]
    err = expect(len(out) == 6 and lost[1] == -9 and "killing itself (SIGKILL)" in lost[2],
                 "w%d killed itself in round %d and was started again" % (LOST, LOSE_ROUND), out)
    if err:
        return err
    again = out[5]
    ranks = [o for o in out[1:] if o[0] != "w%d" % LOST]
    err = expect(server[1] == 0 and all(s == 0 for _, s, _ in ranks),
                 "the server and the four ranks end with status 0", out)
    # The new process joins at the round in progress, its parameters exact.
    version = LOSE_ROUND - 1
    err = err or expect("joined the running job at version %d: parameters exact" % version
                        in again[2], "w%d's new process joins at version %d, exact" %
                        (LOST, version), out)
    for name, _, text in ranks:
        first = version + 1 if name == again[0] else 1
        exact = [int(r) for r in re.findall(r"round +(\d+): .* every aggregate exact", text)]
        err = err or expect(exact == list(range(first, ROUNDS + 1)) and
                            "done, %d rounds in" % ROUNDS in text,
                            "%s: every round exact against the unbroken run (%s)" %
                            (name, exact[-3:]), out)
    err = err or expect("joined the running job (a new process) at version %d" % version
                        in server[2] and "workers joined: 1" in server[2] and
                        "workers removed" not in server[2],
                        "the server names the join and counts it", out)
    if err:
        return err
    print("wait: w%d lost in round %d after %d tensors, its new process joined at version %d; "
          "%d rounds exact, the unbroken run's" % (LOST, LOSE_ROUND, LOSE_AFTER, version, ROUNDS))
    return None


SCENARIOS = {"shrink": scenario_shrink, "wait": scenario_wait}


if __name__ == "__main__":
    sys.exit(scenarios.run(SCENARIOS, "mercury-bsp-loss-"))
