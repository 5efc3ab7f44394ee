#!/usr/bin/python3
"""A hot standby (docs/durability.md), in processes: ps-server s0 with a standby s0b and
two ps-workers, each node in a network namespace of its own on a bridge
(net_af_packet), BSP with momentum, the link emulator losing 2 % of the frames on every
TX queue. Needs root.

* `kill`: s0 is killed (SIGKILL) in the middle of the job and not started again. s0b
  names it lost, takes over and tells both workers, which push again what s0 had not
  answered. The job finishes: ps-worker checks every round's aggregate bit for bit
  against its replay of the unbroken run (a round that fails ends it with status 1), no
  round rolls back, each worker prints the takeover and counts it (standby_takeovers 1,
  tensors_resent as its line says), and s0b counts one promotion and the pushes it
  answered again rather than aggregate twice. Prints the time from the kill to the
  takeover and to the first round completed after it.
* `replicate`: nobody is killed. s0 replicates every chunk version (rank 0's version 0
  and one per round) to s0b before the workers get it: its counters say exactly that
  many versions and bytes (the chunk after: parameters and momentum), none unreplicated,
  the standby never lost; s0b adopted every one, dropped none, was never promoted; the
  workers count no takeover.
* `kill_both`: two server nodes, s0 with its standby s0b and s1 with s1b (each server
  its own shards); s0 is killed at w0's round 40 and s1 at round 80. Each standby takes
  over its server alone; every round exact, none rolled back, each worker prints and
  counts two takeovers, each standby one promotion.
* `partition`: at w0's round 40 s0 and s0b are cut apart from each other only (their
  bridge ports isolated: the workers reach both). Each names the other lost: s0 tells
  the workers its standby is lost and goes on unreplicated once both acknowledged it;
  s0b promotes and tells the workers, which refuse the promotion (s0 still answers
  them, or had named s0b lost before). The job finishes, every round exact, none
  rolled back, no worker takes over (each prints s0's notice and its refusal); s0b
  prints the refusal, counts one promotion and two refusals and ends with status 0
  when the job ends; s0 counts its standby lost once and the updates that waited for
  it.

  standby_test.py BUILD_DIR [kill replicate kill_both partition ...]
"""
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import scenarios  # noqa: E402
from lines import Lines  # noqa: E402
from netns import bridge_namespaces, cut_apart, remove_namespaces  # noqa: E402

MODEL = "a 20000 100x200\nb 300 300\nc 7000 7000\nd 64 64\n"
TIMEOUT_S = 120
ROUNDS = 150
KILL_AFTER = 40  # w0's round that announces the kill
REPLICATE_ROUNDS = 30


def expect(cond, what, outputs=()):
    if cond:
        return None
    text = "\n".join("--- %s, status %s\n%s" % (n, s, t) for n, s, t in outputs)
    return what + ("\n" + text if text else "")


def pairs(servers):
    """The job's server nodes and their standbys: s0 and s0b, then s1 and s1b."""
    return [("s%d" % s, "s%db" % s) for s in range(servers)]


def job_text(tag, servers=1):
    nodes = []
    for s, (server, standby) in enumerate(pairs(servers)):
        nodes += [(server, "server", 1 + 2 * s, ", shards: 1, standby: " + standby),
                  (standby, "standby", 2 + 2 * s, "")]
    nodes += [("w0", "worker", 11, ""), ("w1", "worker", 12, "")]
    y = ["job: {id: 48, name: %s}" % tag,
         "network: {mtu: 1500, peer_timeout_ms: 1500}",
         "mempool: {mbufs: 4095, cache: 64}",
         "eal: {memory_mb: 256, hugepages: off}",
         "training: {sync: bsp, optimizer: momentum, learning_rate: 0.01, momentum: 0.9}",
         "link: {loss: 0.02, seed: 11}",
         "nodes:"]
    for i, (name, role, host, extra) in enumerate(nodes):
        y.append("  - {name: %s, role: %s, ipv4: 10.79.0.%d, ports: [\"net_af_packet%d,iface=eth0\"],"
                 " lcores: [0]%s}" % (name, role, host, i, extra))
    return "\n".join(y) + "\n"


class Job:
    """The job's processes (each server, its standby, two workers), each in its
    namespace; stop() ends what is left and removes the namespaces."""

    def __init__(self, build, tmp, rounds, servers=1):
        self.tag = "sb%d" % (os.getpid() % 100000)
        model = os.path.join(tmp, "model.txt")
        with open(model, "w") as f:
            f.write(MODEL)
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(job_text(self.tag, servers))
        self.ns = {}
        self.procs = []
        self.named = []
        try:
            self.nodes = [n for pair in pairs(servers) for n in pair] + ["w0", "w1"]
            self.ns.update(bridge_namespaces(self.tag, self.nodes))
            server = os.path.join(build, "apps/ps-server")
            worker = os.path.join(build, "apps/ps-worker/ps-worker")
            self.primaries, self.standbys = [], []
            for name, standby in pairs(servers):
                self.primaries.append(self.start(name, [server, "--config", job, "--node", name]))
                self.standbys.append(self.start(standby, [server, "--config", job, "--node",
                                                          standby]))
            self.primary, self.standby = self.primaries[0], self.standbys[0]
            self.workers = [self.start("w%d" % w, [worker, "--config", job, "--node",
                                                    "w%d" % w, "--model", model, "--rounds",
                                                    str(rounds)]) for w in range(2)]
        except BaseException:
            self.stop()
            raise
        self.deadline = time.monotonic() + TIMEOUT_S

    def start(self, node, argv):
        p = subprocess.Popen(["ip", "netns", "exec", self.ns[node]] + argv,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.procs.append(p)
        self.named.append((node, Lines(p)))
        return self.named[-1][1]

    def wait(self, procs):
        """Waits for `procs` (at most until the deadline), then reads what every process
        that ended printed; returns every node's (name, status, output)."""
        for p in procs:
            try:
                p.proc.wait(timeout=max(1, self.deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.proc.kill()
                p.proc.wait()
        for _, p in self.named:
            if p.proc.poll() is not None:
                p.thread.join()
        return self.outputs()

    def outputs(self):
        return [(n, p.proc.poll(), p.text()) for n, p in self.named]

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for _, p in self.named:
            p.thread.join()
        remove_namespaces(self.ns)


def rounds_exact(job, rounds, outputs):
    """None when every worker checked every round exact, finished and rolled nothing back."""
    for p in job.workers:
        text = p.text()
        exact = [int(r) for r in re.findall(r"round +(\d+): .* every aggregate exact", text)]
        err = expect(exact == list(range(1, rounds + 1)) and
                     "done, %d rounds in" % rounds in text and "rolled back" not in text,
                     "a worker's rounds: every one exact, none rolled back (last: %s)" %
                     exact[-3:], outputs)
        if err:
            return err
    return None


def takeovers_counted(job, want, outputs):
    """None when each worker printed one takeover line per (standby, server) of `want` and
    counted them (standby_takeovers, and tensors_resent as the lines say)."""
    for p in job.workers:
        text = p.text()
        took = re.findall(r"standby (s\db) \([^)]*\) of (s\d) took over from \2 at version \d+ "
                          r"\([^)]*\): (\d+) tensors pushed again", text)
        counted = re.search(r"done, .*, standby: (\d+) takeovers, (\d+) tensors pushed again",
                            text)
        err = expect(sorted((a, b) for a, b, _ in took) == sorted(want) and
                     counted is not None and counted.group(1) == str(len(want)) and
                     int(counted.group(2)) == sum(int(n) for _, _, n in took),
                     "a worker's lines on the takeovers %s, and its counters: %s %s" %
                     (want, took, counted and counted.groups()), outputs)
        if err:
            return err
    return None


STANDBY_LINE = (r"standby: (\d+) chunk versions adopted, (\d+) replica packets dropped, "
                r"(\d+) promotions, (\d+) pushes answered again")


def with_job(name, rounds, servers=1):
    """Scenario `name` as a function of its Job of `rounds` rounds (root only: it needs
    network namespaces); the job is stopped after it."""
    def wrap(check):
        def scenario(build, tmp):
            if os.geteuid() != 0:
                print("%s: network namespaces need root; not run" % name)
                return None
            job = Job(build, tmp, rounds, servers)
            try:
                return check(job)
            finally:
                job.stop()
        return scenario
    return wrap


@with_job("kill", ROUNDS)
def scenario_kill(job):
    if not wait_for_round(job, KILL_AFTER):
        return expect(False, "w0 never reached round %d" % KILL_AFTER, job.outputs())
    job.primary.proc.send_signal(signal.SIGKILL)
    job.primary.proc.wait()
    killed = time.monotonic()
    outputs = job.wait(job.workers + [job.standby])
    err = expect(all(p.proc.returncode == 0 for p in job.workers + [job.standby]),
                 "a process of the job failed after the kill", outputs)
    err = err or rounds_exact(job, ROUNDS, outputs)
    err = err or takeovers_counted(job, [("s0b", "s0")], outputs)
    st = job.standby.text()
    m = re.search(STANDBY_LINE, st)
    err = err or expect("promoted: s0 lost" in st and m is not None and m.group(3) == "1" and
                        int(m.group(1)) > 0, "the standby's promotion and counts", outputs)
    if err:
        return err
    took = job.standby.first(r"promoted: s0 lost", killed)
    after = job.workers[0].first(r"round +\d+: ", took or killed)
    held = sum("held while s0 is probed" in p.text() for p in job.workers)
    print("kill: the standby took over %.2f s after the kill (peer timeout 1.5 s); w0's "
          "first round after it ended %.2f s after the kill; %s chunk versions adopted, "
          "%s pushes answered again; %d of 2 workers held the promotion until they lost s0" %
          ((took or killed) - killed, (after or killed) - killed, m.group(1), m.group(4), held))
    return None


@with_job("replicate", REPLICATE_ROUNDS)
def scenario_replicate(job):
    outputs = job.wait(job.workers + [job.primary, job.standby])
    err = expect(all(p.proc.returncode == 0 for _, p in job.named), "a process failed",
                 outputs)
    err = err or rounds_exact(job, REPLICATE_ROUNDS, outputs)
    if err:
        return err
    # Every chunk's version 0 and one version per round, each the chunk after: its
    # float32 parameters and its momentum.
    chunks = int(re.search(r"\((\d+) chunks here\), serving", job.primary.text()).group(1))
    elements = sum(int(line.split()[1]) for line in MODEL.splitlines())
    versions = chunks * (REPLICATE_ROUNDS + 1)
    sent = re.search(r"standby: (\d+) chunk versions replicated \((\d+) bytes, \d+ per "
                     r"chunk version\), (\d+) sent unreplicated, the standby lost (\d+) times",
                     job.primary.text())
    got = sent.groups() if sent else None
    want = (str(versions), str(2 * 4 * elements * (REPLICATE_ROUNDS + 1)), "0", "0")
    err = expect(got == want, "the primary's replication counters: (versions, bytes, "
                 "unreplicated, standby lost) %s, want %s" % (got, want), outputs)
    m = re.search(STANDBY_LINE, job.standby.text())
    got = m.groups() if m else None
    want = (str(versions), "0", "0", "0")
    err = err or expect(got == want, "the standby's counters: (adopted, dropped, "
                        "promotions, answered again) %s, want %s" % (got, want), outputs)
    for p in job.workers:
        err = err or expect("standby: 0 takeovers, 0 tensors pushed again" in p.text(),
                            "a worker's standby counters", outputs)
    return err


def wait_for_round(job, n):
    """Waits until w0 announced round n; False if it never does (a process ended, or the
    deadline)."""
    mark = "w0 round %3d:" % n
    while mark not in job.workers[0].text() and time.monotonic() < job.deadline:
        if any(p.proc.poll() is not None for p in job.workers + job.standbys):
            break
        time.sleep(0.005)
    return mark in job.workers[0].text()


@with_job("kill_both", ROUNDS, servers=2)
def scenario_kill_both(job):
    """Two servers, each with its standby: s0 killed at w0's round 40, s1 at round 80."""
    for primary, at in zip(job.primaries, (KILL_AFTER, 2 * KILL_AFTER)):
        if not wait_for_round(job, at):
            return expect(False, "w0 never reached round %d" % at, job.outputs())
        primary.proc.send_signal(signal.SIGKILL)
        primary.proc.wait()
    outputs = job.wait(job.workers + job.standbys)
    err = expect(all(p.proc.returncode == 0 for p in job.workers + job.standbys),
                 "a process of the job failed after the kills", outputs)
    err = err or rounds_exact(job, ROUNDS, outputs)
    err = err or takeovers_counted(job, [("s0b", "s0"), ("s1b", "s1")], outputs)
    for (server, _), standby in zip(pairs(2), job.standbys):
        m = re.search(STANDBY_LINE, standby.text())
        err = err or expect("promoted: %s lost" % server in standby.text() and m is not None and
                            m.group(3) == "1" and int(m.group(1)) > 0,
                            "%s's standby: its promotion and counts" % server, outputs)
    return err


@with_job("partition", ROUNDS)
def scenario_partition(job):
    """s0 and s0b cut apart from each other at w0's round 40; the workers reach both."""
    if not wait_for_round(job, KILL_AFTER):
        return expect(False, "w0 never reached round %d" % KILL_AFTER, job.outputs())
    cut_apart(job.ns, job.nodes, "s0", "s0b")
    outputs = job.wait(job.workers + [job.primary, job.standby])
    err = expect(all(p.proc.returncode == 0 for _, p in job.named),
                 "a process of the job failed after the partition", outputs)
    err = err or rounds_exact(job, ROUNDS, outputs)
    for p in job.workers:
        err = err or expect(
            re.search(r"standby s0b \([^)]*\) of s0 announced its promotion \(s0 lost\) at "
                      r"version \d+, but s0 (still answers this worker|named its standby lost "
                      r"before): promotion refused", p.text()) is not None and
            re.search(r"server s0 \([^)]*\): it named its standby s0b lost; it goes on without "
                      r"a standby", p.text()) is not None and
            "standby: 0 takeovers, 0 tensors pushed again" in p.text(),
            "a worker's lines (s0's notice, its refusal), and no takeover counted", outputs)
    st = job.standby.text()
    m = re.search(STANDBY_LINE + r", refused by (\d+) workers", st)
    err = err or expect(
        "promoted: s0 lost" in st and
        re.search(r"promotion refused by w[01] \(rank [01]\): s0 (still answers it|named its "
                  r"standby lost before) \(a partition between s0 and its standby\?\); not "
                  r"serving", st) is not None and
        m is not None and m.group(3) == "1" and m.group(4) == "0" and m.group(5) == "2",
        "the standby's refusal line and counts (one promotion, two refusals)", outputs)
    sent = re.search(r"standby: \d+ chunk versions replicated \(\d+ bytes, \d+ per chunk "
                     r"version\), (\d+) sent unreplicated, the standby lost (\d+) times",
                     job.primary.text())
    err = err or expect("standby s0b lost: updates go out unreplicated" in job.primary.text() and
                        sent is not None and int(sent.group(1)) > 0 and sent.group(2) == "1",
                        "the server's line and counts of its standby lost", outputs)
    if err:
        return err
    print("partition: every round exact, no takeover; the standby refused by %s workers; "
          "the server, its standby named lost and the workers told, let %s updates out "
          "unreplicated that waited for it" % (m.group(5), sent.group(1)))
    return None


SCENARIOS = {"kill": scenario_kill, "replicate": scenario_replicate,
             "kill_both": scenario_kill_both, "partition": scenario_partition}


if __name__ == "__main__":
    sys.exit(scenarios.run(SCENARIOS, "mercury-standby-"))
