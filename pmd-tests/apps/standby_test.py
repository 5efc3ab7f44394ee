#!/usr/bin/python3
"""A hot standby (docs/durability.md), in processes: ps-server s0 with a standby s0b and
two ps-workers, each node in a network namespace of its own on a bridge
(net_af_packet), BSP with momentum, the link emulator losing 2 % of the frames on every
TX queue. Needs root.

* `kill`: s0 is killed (SIGKILL) in the middle of the job and not started again. s0b
  names it lost, takes over and tells both workers, which push again what s0 had not
  answered. The job finishes: ps-worker checks every round's aggregate bit for bit
  against its replay of the unbroken run (a round that fails ends it with status 1), no
  round rolls back, each worker prints the takeover, and s0b counts one promotion and
  the pushes it answered again rather than aggregate twice. Prints the time from the
  kill to the takeover and to the first round completed after it.

  standby_test.py BUILD_DIR [kill ...]
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
from netns import bridge_namespaces, remove_namespaces  # noqa: E402

MODEL = "a 20000 100x200\nb 300 300\nc 7000 7000\nd 64 64\n"
TIMEOUT_S = 120
ROUNDS = 150
KILL_AFTER = 40  # w0's round that announces the kill


def expect(cond, what, outputs=()):
    if cond:
        return None
    text = "\n".join("--- %s, status %s\n%s" % (n, s, t) for n, s, t in outputs)
    return what + ("\n" + text if text else "")


def job_text(tag):
    nodes = [("s0", "server", 1, ", shards: 1, standby: s0b"), ("s0b", "standby", 2, ""),
             ("w0", "worker", 11, ""), ("w1", "worker", 12, "")]
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


def scenario_kill(build, tmp):
    if os.geteuid() != 0:
        print("kill: network namespaces need root; not run")
        return None
    tag = "sb%d" % (os.getpid() % 100000)
    model = os.path.join(tmp, "model.txt")
    with open(model, "w") as f:
        f.write(MODEL)
    job = os.path.join(tmp, "job.yaml")
    with open(job, "w") as f:
        f.write(job_text(tag))
    ns = {}
    procs = []

    def start(node, argv):
        p = subprocess.Popen(["ip", "netns", "exec", ns[node]] + argv, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        procs.append(p)
        return Lines(p)

    server = os.path.join(build, "apps/ps-server")
    worker = os.path.join(build, "apps/ps-worker/ps-worker")
    try:
        ns.update(bridge_namespaces(tag, ["s0", "s0b", "w0", "w1"]))
        primary = start("s0", [server, "--config", job, "--node", "s0"])
        standby = start("s0b", [server, "--config", job, "--node", "s0b"])
        workers = [start("w%d" % w, [worker, "--config", job, "--node", "w%d" % w, "--model",
                                     model, "--rounds", str(ROUNDS)]) for w in range(2)]
        deadline = time.monotonic() + TIMEOUT_S
        mark = "w0 round %3d:" % KILL_AFTER
        while mark not in workers[0].text() and time.monotonic() < deadline:
            if any(p.proc.poll() is not None for p in workers + [standby]):
                break
            time.sleep(0.005)
        named = [("s0", primary), ("s0b", standby), ("w0", workers[0]), ("w1", workers[1])]
        if mark not in workers[0].text():
            return expect(False, "w0 never reached round %d" % KILL_AFTER,
                          [(n, p.proc.poll(), p.text()) for n, p in named])
        primary.proc.send_signal(signal.SIGKILL)
        primary.proc.wait()
        killed = time.monotonic()
        for p in workers + [standby]:
            try:
                p.proc.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.proc.kill()
                p.proc.wait()
        for _, p in named:
            p.thread.join()
        outputs = [(n, p.proc.returncode, p.text()) for n, p in named]
        err = expect(all(p.proc.returncode == 0 for p in workers + [standby]),
                     "a process of the job failed after the kill", outputs)
        for p in workers:
            text = p.text()
            exact = [int(r) for r in re.findall(r"round +(\d+): .* every aggregate exact", text)]
            err = err or expect(exact == list(range(1, ROUNDS + 1)) and
                                "done, %d rounds in" % ROUNDS in text and
                                "rolled back" not in text,
                                "a worker's rounds: every one exact, none rolled back "
                                "(last: %s)" % exact[-3:], outputs)
            err = err or expect(re.search(r"standby .* of s0 took over from s0 at version \d+",
                                          text) is not None,
                                "a worker's line on the takeover", outputs)
        st = standby.text()
        m = re.search(r"standby: (\d+) chunk versions adopted, (\d+) replica packets dropped, "
                      r"(\d+) promotions, (\d+) pushes answered again", st)
        err = err or expect("promoted: s0 lost" in st and m is not None and m.group(3) == "1" and
                            int(m.group(1)) > 0, "the standby's promotion and counts", outputs)
        if err:
            return err
        took = standby.first(r"promoted: s0 lost", killed)
        after = workers[0].first(r"round +\d+: ", took or killed)
        print("kill: the standby took over %.2f s after the kill (peer timeout 1.5 s); w0's "
              "first round after it ended %.2f s after the kill; %s chunk versions adopted, "
              "%s pushes answered again" %
              ((took or killed) - killed, (after or killed) - killed, m.group(1), m.group(4)))
        return None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        remove_namespaces(ns)


SCENARIOS = {"kill": scenario_kill}


if __name__ == "__main__":
    sys.exit(scenarios.run(SCENARIOS, "mercury-standby-"))
