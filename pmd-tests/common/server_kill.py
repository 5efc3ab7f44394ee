"""A server killed mid-run and started again with `ps-server --resume`: a BSP job of one
or more ps-servers and two ps-workers, each node a process in a network namespace of its
own on a bridge (net_af_packet: a memif client never reconnects), the workers waiting
for a lost server (network.on_server_loss: wait). One server is killed (SIGKILL) once w0
printed a round and started again from its checkpoints (docs/durability.md). Shared by
pmd-tests/apps/checkpoint_test.py (what the job must end as) and
benchmarks/peers/rollback_bench.py (how long it takes). Needs root."""
import os
import signal
import subprocess
import time

from lines import Lines
from netns import bridge_namespaces, end

LINK = "link: {loss: 0.02, seed: 11}"
TIMEOUT_S = 120


def job_text(tag, ckpt, servers, every, link=LINK, server_lcores="[0, 2]", keep=2):
    """The job file: servers s0.. (one shard each, on `server_lcores`: the net core's,
    then the shard's, inline when it shares a CPU with the net core), workers w0 and w1,
    checkpoints every `every` versions into `ckpt`, the newest `keep` kept."""
    y = ["job: {id: 47, name: %s}" % tag,
         "network: {mtu: 1500, peer_timeout_ms: 1500, on_server_loss: wait, server_wait_s: 60}",
         "mempool: {mbufs: 4095, cache: 64}",
         "eal: {memory_mb: 256, hugepages: off}",
         "training: {sync: bsp, optimizer: momentum, learning_rate: 0.01, momentum: 0.9}",
         "checkpoint: {dir: %s, every_versions: %d, keep: %d}" % (ckpt, every, keep),
         link,
         "nodes:"]
    for s in range(servers):
        y.append("  - {name: s%d, role: server, ipv4: 10.78.0.%d, ports: [\"net_af_packet%d,"
                 "iface=eth0\"], lcores: %s, shards: 1}" % (s, 1 + s, s, server_lcores))
    for w in range(2):
        y.append("  - {name: w%d, role: worker, ipv4: 10.78.0.%d, ports: [\"net_af_packet%d,"
                 "iface=eth0\"], lcores: [1]}" % (w, 11 + w, servers + w))
    return "\n".join(y) + "\n"


class Outcome:
    """What a run left: each process's status and output, and when the kill was."""

    def __init__(self):
        self.workers = []  # (status, output), w0 first
        self.worker_lines = []  # Lines of each worker (the time each line was read)
        self.killed = ""  # the killed process's output
        self.restarted = (None, "")  # its new process
        self.running = []  # (status, output) of the servers not killed
        self.kill_time = 0.0  # time.monotonic() of the kill
        self.error = None  # why the run could not go as planned

    def everything(self):
        return ([(-9, self.killed), self.restarted] + self.running + self.workers)


def run(build, tmp, model, servers=1, kill="s0", rounds=150, kill_after=40, every=10,
        delay_s=0.0, dtype="float32", before_restart=None, worker_args=(), tag=None,
        server_lcores="[0, 2]", keep=2):
    """Runs the job once; returns an Outcome. `before_restart(ckpt)` runs between the
    kill and the restart; `worker_args` go to both ps-workers."""
    tag = tag or "ck%d" % (os.getpid() % 100000)
    ckpt = os.path.join(tmp, "ckpt")
    job = os.path.join(tmp, "job.yaml")
    with open(job, "w") as f:
        f.write(job_text(tag, ckpt, servers, every, server_lcores=server_lcores, keep=keep))
    names = ["s%d" % s for s in range(servers)]
    ns = {}
    procs = []
    out = Outcome()

    def start(node, argv):
        p = subprocess.Popen(["ip", "netns", "exec", ns[node]] + argv, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        procs.append(p)
        return Lines(p)

    def server_argv(node):
        return [os.path.join(build, "apps/ps-server"), "--config", job, "--node", node]

    def wait(lines, bound):
        try:
            lines.proc.wait(timeout=max(1, bound))
        except subprocess.TimeoutExpired:
            lines.proc.kill()
            lines.proc.wait()
        lines.thread.join()
        return (lines.proc.returncode, lines.text())

    try:
        ns.update(bridge_namespaces(tag, names + ["w0", "w1"]))
        server = {n: start(n, server_argv(n)) for n in names}
        workers = [start("w%d" % w, [os.path.join(build, "apps/ps-worker/ps-worker"), "--config",
                                     job, "--node", "w%d" % w, "--model", model, "--rounds",
                                     str(rounds), "--dtype", dtype] + list(worker_args))
                   for w in range(2)]
        out.worker_lines = workers
        deadline = time.monotonic() + TIMEOUT_S
        mark = "w0 round %3d:" % kill_after
        while mark not in workers[0].text() and time.monotonic() < deadline:
            if any(w.proc.poll() is not None for w in workers):
                break
            time.sleep(0.005)
        if mark not in workers[0].text():
            out.error = "w0 never reached round %d" % kill_after
            for p in procs:
                if p.poll() is None:
                    p.kill()
            out.workers = [wait(w, 5) for w in workers]
            out.running = [wait(server[n], 5) for n in names]
            return out
        server[kill].proc.send_signal(signal.SIGKILL)
        server[kill].proc.wait()
        out.kill_time = time.monotonic()
        if before_restart:
            before_restart(ckpt)
        time.sleep(max(0.0, out.kill_time + delay_s - time.monotonic()))
        second = start(kill, server_argv(kill) + ["--resume", ckpt])
        out.workers = [wait(w, deadline - time.monotonic()) for w in workers]
        out.restarted = wait(second, 30)
        out.running = [wait(server[n], 30) for n in names if n != kill]
        server[kill].thread.join()
        out.killed = server[kill].text()
        return out
    finally:
        end(procs, ns)
