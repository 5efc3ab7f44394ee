#!/usr/bin/python3
"""A server's background checkpoints and `ps-server --resume`, in processes: ps-server
and two ps-workers over net_memif, BSP with momentum, the link emulator losing 2 % of
the frames on every TX queue.

* `resume`: a job of 7 rounds with `checkpoint.every_versions: 3` leaves the server's
  checkpoints of versions 3 and 6 (no temporary file; a checkpoint version that comes
  while the writer still writes the previous one is skipped, and the server counts it:
  rounds here take a millisecond). A new server started with `--resume` serves from the
  newest, V, and new workers run the rounds after it up to 10: ps-worker replays the
  rounds before V in its reference and checks the resumed parameters and every later
  round's aggregate bit for bit against it, so the resumed job is the unbroken one,
  momentum included. Two checkpoints at most are kept.
* `kill`: the server killed (SIGKILL) mid-run and started again at once with `--resume`,
  each node in a network namespace of its own on a bridge (net_af_packet; a memif client
  never reconnects), the workers with `network.on_server_loss: wait`: each worker's round
  fails, it waits, the job rolls back to the server's newest checkpoint (the same version
  on both ranks), ps-worker checks the parameters at that version and every later round
  bit for bit against its replay of the unbroken run, and the job finishes. Needs root.
  `kill_late`: the same with the server started again 2.5 s after the kill, once the
  workers' liveness has named it lost.
* `resume_half`, `kill_half`: `resume` and `kill` with half-precision tensors (ps-worker
  --dtype mixed: the model's tensors float32, bfloat16, float16 and float32): the
  checkpoint holds the servers' float32 master parameters and momentum, the resumed
  server rounds them once into each tensor's dtype, and ps-worker checks every bfloat16
  and float16 buffer bit for bit against its replay of those masters, at the resumed (or
  rolled-back) version and in every later round.
* `kill2`, `kill2_s0`: `kill` with two server nodes, s1 (or s0, which runs the barrier)
  killed and resumed: s0 (s1), still running, rolls back to the same version from its own
  checkpoint once both workers asked (docs/durability.md, "Several servers"), and every
  round after it is checked bit for bit as in `kill`. The servers' shards run inline in
  `kill2`, on a shard core of their own in `kill2_s0`. `older_version`: s1 killed and s0's
  checkpoint of s1's newest version V deleted before s1 starts again (3 kept): s0 answers
  with its newest older one, V - 10, and the job rolls back to it on both servers.
  `no_common_version`: s0's checkpoints of V and older deleted: s0 refuses the rollback,
  naming the versions it has, and every worker is told why.
* `refused`: a checkpoint with a flipped byte, one of another optimizer (the job file
  says adam) and one of another model (the workers declare other tensors) are refused,
  each with its reason: the first two before the server starts, the last when the
  workers declared (every worker is told why).

  checkpoint_test.py BUILD_DIR [resume|kill|kill_late|refused|resume_half|kill_half|kill2|
                                kill2_s0|older_version|no_common_version ...]
  (default: resume, kill, kill_late, refused)
"""
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import scenarios  # noqa: E402
from memif_nodes import memif_nodes  # noqa: E402
from outputs import output  # noqa: E402
import server_kill  # noqa: E402

LINK = server_kill.LINK
MODEL = "a 20000 100x200\nb 300 300\nc 7000 7000\nd 64 64\n"
OTHER_MODEL = "a 20000 100x200\nb 301 301\n"
TIMEOUT_S = 120


def job_text(tag, ckpt_dir, optimizer="optimizer: momentum, learning_rate: 0.01, momentum: 0.9"):
    y = ["job: {id: 46, name: %s}" % tag,
         "network: {mtu: 1500, peer_timeout_ms: 20000}",
         "mempool: {mbufs: 4095, cache: 64}",
         "eal: {memory_mb: 256, hugepages: off}",
         "training: {sync: bsp, %s}" % optimizer,
         "checkpoint: {dir: %s, every_versions: 3, keep: 2}" % ckpt_dir,
         LINK]
    y += memif_nodes(2, lambda w: "/tmp/%s-w%d.sock" % (tag, w), "[0, 2]", lambda w: 1 + 2 * w)
    return "\n".join(y) + "\n"


class Run:
    """A job's processes: ps-server (with its own arguments) and two ps-workers."""

    def __init__(self, build, job, model, rounds, server_args=(), dtype="float32"):
        self.server = subprocess.Popen(
            [os.path.join(build, "apps/ps-server"), "--config", job, "--node", "s0"] +
            list(server_args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.workers = [subprocess.Popen(
            [os.path.join(build, "apps/ps-worker/ps-worker"), "--config", job, "--node",
             "w%d" % w, "--model", model, "--rounds", str(rounds), "--dtype", dtype],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for w in range(2)]

    def finish(self):
        """Every process's (status, output), server first; kills what is left at the bound."""
        out = []
        for p in [self.server] + self.workers:
            out.append(output(p, TIMEOUT_S))
        return out


def files(d):
    return sorted(os.listdir(d))


def expect(cond, what, outputs=()):
    if cond:
        return None
    text = "\n".join("--- status %s\n%s" % (s, t) for s, t in outputs)
    return what + ("\n" + text if text else "")


def memif_setup(tmp, tag, ckpt_in_job):
    """The checkpoint directory, the model file and the memif job file in `tmp`."""
    ckpt = os.path.join(tmp, "ckpt")
    os.mkdir(ckpt)
    model = os.path.join(tmp, "model.txt")
    with open(model, "w") as f:
        f.write(MODEL)
    job = os.path.join(tmp, "job.yaml")
    with open(job, "w") as f:
        f.write(job_text(tag, ckpt_in_job))
    return ckpt, model, job


def scenario_resume(build, tmp, dtype="float32"):
    # A relative checkpoint.dir: the job file's neighbour.
    ckpt, model, job = memif_setup(tmp, "mercury-ckpt-%d" % os.getpid(), "ckpt")

    def counted(text, versions):
        """The server's count: every checkpoint version written or skipped, none failed."""
        m = re.search(r"checkpoints: (\d+) written .*, (\d+) failed, (\d+) skipped", text)
        return m is not None and m.group(2) == "0" and \
            int(m.group(1)) + int(m.group(3)) == versions

    first = Run(build, job, model, 7, dtype=dtype).finish()
    err = expect(all(s == 0 for s, _ in first), "the first job failed", first)
    written = files(ckpt)
    err = err or expect(written and set(written) <= {"s0.v0000000003.ckpt", "s0.v0000000006.ckpt"}
                        and counted(first[0][1], 2),
                        "checkpoints after 7 rounds: %s" % written, first)
    if err:
        return err
    v = int(written[-1][4:14])
    second = Run(build, job, model, 10, ["--resume", ckpt], dtype).finish()
    err = expect(all(s == 0 for s, _ in second), "the resumed job failed", second)
    err = err or expect("resuming from %s/%s: version %d" % (ckpt, written[-1], v)
                        in second[0][1], "the server's resume line", second)
    for s, text in second[1:]:
        err = err or expect("resumed at version %d parameters exact" % v in text,
                            "a worker's resumed parameters", second)
        rounds = re.findall(r"round +(\d+): .* every aggregate exact", text)
        err = err or expect(rounds == [str(r) for r in range(v + 1, 11)], "rounds %s" % rounds,
                            second)
        err = err or expect("done, 10 rounds" in text, "a worker's end", second)
    # Versions after the resumed one: 9 (from 6), or 6 and 9 (from 3).
    later = [x for x in range(v + 3, 11, 3)]
    err = err or expect(counted(second[0][1], len(later)) and len(files(ckpt)) <= 2 and
                        not any(f.endswith(".tmp") for f in os.listdir(ckpt)),
                        "checkpoints after the resumed job: %s" % files(ckpt), second)
    return err


def scenario_refused(build, tmp):
    # A checkpoint to refuse: one job of 3 rounds.
    tag = "mercury-ckref-%d" % os.getpid()
    ckpt, model, job = memif_setup(tmp, tag, os.path.join(tmp, "ckpt"))
    first = Run(build, job, model, 3).finish()
    err = expect(all(s == 0 for s, _ in first) and files(ckpt) == ["s0.v0000000003.ckpt"],
                 "the job that writes the checkpoint: %s" % files(ckpt), first)
    if err:
        return err
    server = os.path.join(build, "apps/ps-server")
    path = os.path.join(ckpt, "s0.v0000000003.ckpt")
    good = open(path, "rb").read()

    def resume_alone(job_file, directory):
        return subprocess.run([server, "--config", job_file, "--node", "s0", "--resume",
                               directory], capture_output=True, text=True, timeout=TIMEOUT_S)

    # A flipped byte in the last record's payload.
    bad_dir = os.path.join(tmp, "corrupt")
    os.mkdir(bad_dir)
    bad = bytearray(good)
    bad[-9] ^= 0x40
    open(os.path.join(bad_dir, "s0.v0000000003.ckpt"), "wb").write(bytes(bad))
    r = resume_alone(job, bad_dir)
    err = expect(r.returncode != 0 and "is corrupt: record" in r.stderr and
                 "fails its payload CRC" in r.stderr,
                 "a corrupt checkpoint: status %d, %s" % (r.returncode, r.stderr))
    # Another optimizer in the job file.
    adam = os.path.join(tmp, "adam.yaml")
    with open(adam, "w") as f:
        f.write(job_text(tag, ckpt, "optimizer: adam, learning_rate: 0.001"))
    r = resume_alone(adam, ckpt)
    err = err or expect(r.returncode != 0 and
                        "is of optimizer momentum, the job's is adam" in r.stderr,
                        "another optimizer: status %d, %s" % (r.returncode, r.stderr))
    # A directory without one.
    r = resume_alone(job, tmp)
    err = err or expect(r.returncode != 0 and "no checkpoint of node s0 in" in r.stderr,
                        "no checkpoint: status %d, %s" % (r.returncode, r.stderr))
    if err:
        return err
    # Another model: known once the workers declared it.
    other = os.path.join(tmp, "other.txt")
    with open(other, "w") as f:
        f.write(OTHER_MODEL)
    out = Run(build, job, other, 4, ["--resume", ckpt]).finish()
    why = "is not this job's: record 0 (byte 0) is of another job"
    err = expect(out[0][0] == 2 and why in out[0][1], "the server refuses another model", out)
    for s, text in out[1:]:
        err = err or expect(s != 0 and why in text, "a worker is told why", out)
    return err


KILL_ROUNDS = 150
KILL_AFTER = 40  # w0's round that announces the kill
KILL_EVERY = 10  # checkpoint.every_versions


def kill_run(build, tmp, **kw):
    """server_kill.run with this file's model, or None (printed) without root."""
    if os.geteuid() != 0:
        print("kill: network namespaces need root; not run")
        return None
    model = os.path.join(tmp, "model.txt")
    with open(model, "w") as f:
        f.write(MODEL)
    return server_kill.run(build, tmp, model, rounds=KILL_ROUNDS, kill_after=KILL_AFTER,
                           every=KILL_EVERY, **kw)


def kill_job(build, tmp, **kw):
    """kill_run, and whether every process ended well: (its Outcome or None without root,
    every output, the error or None)."""
    out = kill_run(build, tmp, **kw)
    if out is None:
        return None, [], None
    everything = out.everything()
    if out.error:
        return out, everything, expect(False, out.error, everything)
    return out, everything, expect(
        all(s == 0 for s, _ in out.workers + out.running) and out.restarted[0] == 0,
        "a process of the job failed", everything)


def scenario_kill(build, tmp, delay_s=0.0, dtype="float32", servers=1, kill="s0",
                  server_lcores="[0, 2]"):
    out, everything, err = kill_job(build, tmp, delay_s=delay_s, dtype=dtype, servers=servers,
                                    kill=kill, server_lcores=server_lcores)
    if out is None or out.error:
        return err
    ckpt = os.path.join(tmp, "ckpt")
    versions = [re.findall(r"rolled back to version (\d+): parameters exact", t)
                for _, t in out.workers]
    err = err or expect(all(len(v) == 1 for v in versions) and versions[0] == versions[1],
                        "each worker rolls back once, to the same version: %s" % versions,
                        everything)
    if err:
        return err
    v = int(versions[0][0])
    err = expect(v > 0 and v % KILL_EVERY == 0 and v <= KILL_AFTER + 2,
                 "the version rolled back to: %d" % v, everything)
    err = err or expect("resuming from %s/%s.v%010d.ckpt: version %d" % (ckpt, kill, v, v)
                        in out.restarted[1], "the server resumed from that checkpoint",
                        everything)
    for s, (_, t) in zip([n for n in ("s%d" % i for i in range(servers)) if n != kill],
                         out.running):
        # Each server still running rolled back to it from its own checkpoint.
        err = err or expect("rolled back to version %d: every rank asked; the shards restore "
                            "%s/%s.v%010d.ckpt" % (v, ckpt, s, v) in t,
                            "%s rolled back to version %d" % (s, v), everything)
    for _, t in out.workers:
        # The rounds from the version on, each checked against the unbroken run.
        after = t[t.index("rolled back to version"):]
        exact = [int(r) for r in re.findall(r"round +(\d+): .* every aggregate exact", after)]
        err = err or expect(exact == list(range(v + 1, KILL_ROUNDS + 1)) and
                            "done, %d rounds (1 rolled back)" % KILL_ROUNDS in t,
                            "a worker's rounds after the rollback: %s" % exact[-3:], everything)
    print("kill %s of %d, restarted %.1f s later: rolled back to version %d" %
          (kill, servers, delay_s, v))
    return err


def drop_running_copy(chosen, older_too=False):
    """A before_restart that deletes s0's checkpoint of s1's newest version (noted in
    `chosen`), and with `older_too` every older one of s0's, once the job has stopped
    moving."""
    def drop(ckpt):
        time.sleep(0.5)  # s0 writes nothing more: the job cannot pass s1's versions
        newest = max(int(f[4:14]) for f in os.listdir(ckpt)
                     if f.startswith("s1.v") and f.endswith(".ckpt"))
        chosen.append(newest)
        for f in os.listdir(ckpt):
            if f.startswith("s0.v") and f.endswith(".ckpt") and (
                    int(f[4:14]) == newest or older_too and int(f[4:14]) < newest):
                os.remove(os.path.join(ckpt, f))
    return drop


def scenario_older_version(build, tmp):
    """Two servers keeping 3 checkpoints, s1 killed; before it is started again s0's
    checkpoint of s1's newest version V is deleted: s0 answers with its newest older one,
    V - 10, which every server rolls back to (s1 loading its older file), and every round
    after it is checked bit for bit."""
    chosen = []
    out, everything, err = kill_job(build, tmp, servers=2, kill="s1", keep=3,
                                    before_restart=drop_running_copy(chosen))
    if out is None or out.error:
        return err
    ckpt = os.path.join(tmp, "ckpt")
    v = chosen[0] - KILL_EVERY
    for node, (_, t) in (("s0", out.running[0]), ("s1", out.restarted)):
        err = err or expect("rolled back to version %d: every rank asked; the shards restore "
                            "%s/%s.v%010d.ckpt" % (v, ckpt, node, v) in t,
                            "%s rolled back to version %d" % (node, v), everything)
    for _, t in out.workers:
        exact = re.findall(r"rolled back to version (\d+): parameters exact", t)
        after = t[t.index("rolled back to version"):] if exact else ""
        rounds = [int(r) for r in re.findall(r"round +(\d+): .* every aggregate exact", after)]
        err = err or expect(exact == [str(v)] and rounds == list(range(v + 1, KILL_ROUNDS + 1)),
                            "a worker rolls back to %d once, then every round: %s %s" %
                            (v, exact, rounds[-3:]), everything)
    print("older_version: s1 resumed at %d, s0 had no checkpoint of it: the job rolled back "
          "to %d" % (chosen[0], v))
    return err


def scenario_no_common_version(build, tmp):
    """Two servers, s1 killed; before it is started again s0's checkpoints of s1's newest
    version and older are deleted: s0 refuses the rollback, naming the versions it has,
    and every worker is told why."""
    chosen = []
    out = kill_run(build, tmp, servers=2, kill="s1",
                   before_restart=drop_running_copy(chosen, older_too=True))
    if out is None:
        return None
    everything = out.everything()
    if out.error:
        return expect(False, out.error, everything)
    why = "cannot roll back to version %d (w" % chosen[0]
    err = expect(out.running[0][0] != 0 and why in out.running[0][1] and
                 "no checkpoint of node s0 at or before version %d in" % chosen[0]
                 in out.running[0][1],
                 "s0 refuses the rollback to version %d" % chosen[0], everything)
    for s, t in out.workers:
        err = err or expect(s != 0 and "stopped the job: " + why in t,
                            "a worker is told why", everything)
    return err


SCENARIOS = {"resume": scenario_resume, "kill": scenario_kill,
             # Two servers: one killed and resumed, the other rolls back (either one).
             "kill2": lambda build, tmp: scenario_kill(build, tmp, servers=2, kill="s1"),
             # ... s0, each server's shard on a shard core (lcore 1: its tasks on the ring).
             "kill2_s0": lambda build, tmp: scenario_kill(build, tmp, servers=2, kill="s0",
                                                          server_lcores="[0, 1]"),
             "older_version": scenario_older_version,
             "no_common_version": scenario_no_common_version,
             # Started again after liveness named it lost (1.125 x the 1.5 s timeout).
             "kill_late": lambda build, tmp: scenario_kill(build, tmp, 2.5),
             "refused": scenario_refused,
             "resume_half": lambda build, tmp: scenario_resume(build, tmp, "mixed"),
             "kill_half": lambda build, tmp: scenario_kill(build, tmp, dtype="mixed")}
DEFAULT = ["resume", "kill", "kill_late", "refused"]


if __name__ == "__main__":
    sys.exit(scenarios.run(SCENARIOS, "mercury-ckpt-", DEFAULT))
