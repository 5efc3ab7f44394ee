"""A real Slurm cluster of one node on this machine, for the tests: munged,
slurmctld and slurmd from Debian's munge and slurm-wlm, all under a private
directory with their own key, socket, ports, state, spool, logs and pid
files, started by the test and stopped by it, whatever happens.

    with SlurmCluster() as slurm:
        slurm.run(["sbatch", "--wait", "--ntasks=5", "job.sh"])

A test file's classes derive from ClusterTest (one cluster and one work
directory for all their tests) and its main calls test_main().

Every client command gets SLURM_CONF through `slurm.env`. The node declares
more CPUs than this machine has (`CPUs=8`, with
SlurmdParameters=config_overrides), so 5 tasks fit on 2 CPUs; tasks run as
root with no CPU binding (task/none) and are tracked by process
(proctrack/linuxproc), so no cgroup is needed.
"""
import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "scontrol", "sinfo", "scancel", "squeue")


def missing_programs():
    """The programs a cluster needs that are not installed."""
    return [p for p in DAEMONS + CLIENTS if shutil.which(p) is None
            and not os.path.exists(os.path.join("/usr/sbin", p))]


def _program(name):
    return shutil.which(name) or os.path.join("/usr/sbin", name)


def _free_ports(n):
    """n TCP ports free now on this machine (bound, then released)."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class SlurmCluster:
    def __init__(self, cpus=8, prefix="mercury-slurm-"):
        self.cpus = cpus
        self.prefix = prefix
        self.dir = None
        self.procs = {}
        self.host = socket.gethostname().split(".")[0]
        self.env = None

    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix=self.prefix)
        # Also stopped when the test ends by an exception that skips its
        # teardown (stop_on_sigterm() turns SIGTERM into one).
        atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def path(self, name):
        return os.path.join(self.dir, name)

    def _start(self):
        d = self.dir
        os.chmod(d, 0o755)  # slurmd reads the conf as root; munged wants no world-writable dirs
        key = self.path("munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self._daemon("munged", [_program("munged"), "-F", "-f", "--key-file=" + key,
                                "--socket=" + self.path("munge.sock"),
                                "--pid-file=" + self.path("munged.pid"),
                                "--log-file=" + self.path("munged.log"),
                                "--seed-file=" + self.path("munged.seed")])
        self._wait(lambda: os.path.exists(self.path("munge.sock")), 10, "munged's socket")
        ctld_port, slurmd_port = _free_ports(2)
        for sub in ("state", "spool"):
            os.makedirs(self.path(sub))
        conf = self.path("slurm.conf")
        with open(conf, "w") as f:
            f.write(f"""ClusterName=mercury
SlurmctldHost={self.host}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.path("munge.sock")}
CredType=cred/munge
StateSaveLocation={self.path("state")}
SlurmdSpoolDir={self.path("spool")}
SlurmctldPidFile={self.path("slurmctld.pid")}
SlurmdPidFile={self.path("slurmd.pid")}
SlurmctldLogFile={self.path("slurmctld.log")}
SlurmdLogFile={self.path("slurmd.log")}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
NodeName={self.host} CPUs={self.cpus} State=UNKNOWN
PartitionName=mercury Nodes={self.host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
        self.env = dict(os.environ, SLURM_CONF=conf)
        for name in ("slurmctld", "slurmd"):
            self._daemon(name, [_program(name), "-D", "-f", conf])
            if name == "slurmctld":
                self._wait(lambda: self._quiet(["scontrol", "ping"]), 20, "slurmctld")
        self._wait(lambda: "idle" in self.run(["sinfo", "-h", "-o", "%T"], check=False).stdout,
                   30, f"node {self.host} idle in sinfo")

    def _daemon(self, name, argv):
        """Starts a daemon in the foreground (so its PID is ours to stop)."""
        with open(self.path(name + ".out"), "w") as err:
            self.procs[name] = subprocess.Popen(argv, env=self.env or os.environ,
                                                stdout=subprocess.DEVNULL, stderr=err)

    def _quiet(self, argv):
        return subprocess.run(argv, env=self.env, capture_output=True, text=True,
                              timeout=10).returncode == 0

    def _wait(self, ready, seconds, what):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode} before {what}:\n"
                                       + self.logs())
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"no {what} within {seconds} s:\n" + self.logs())

    def run(self, argv, check=True, timeout=600, **kw):
        r = subprocess.run(argv, env=kw.pop("env", self.env), capture_output=True, text=True,
                           timeout=timeout, **kw)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited with {r.returncode}:\n{r.stdout}{r.stderr}")
        return r

    def logs(self, lines=20):
        out = []
        for name in ("munged.log", "slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"):
            p = self.path(name)
            if os.path.exists(p):
                with open(p, errors="replace") as f:
                    tail = f.read().splitlines()[-lines:]
                out.append(f"== {name}\n" + "\n".join(tail))
        return "\n".join(out)

    def stop(self):
        """Cancels every job, then stops the daemons (SIGTERM, then SIGKILL
        after 10 s) and removes the directory. Idempotent."""
        if self.env is not None and self.procs.get("slurmctld") is not None and \
                self.procs["slurmctld"].poll() is None:
            try:
                self.run(["scancel", "--full", "--cluster", "mercury", "-u", "root"], check=False,
                         timeout=10)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and self.run(
                        ["squeue", "-h"], check=False, timeout=10).stdout.strip():
                    time.sleep(0.2)
            except (subprocess.SubprocessError, OSError):
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def stop_on_sigterm():
    """SIGTERM (meson's timeout, a CI runner stopping) raises
    KeyboardInterrupt, so that finally blocks and atexit (SlurmCluster.stop)
    run before the process ends."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, interrupt)


class ClusterTest(unittest.TestCase):
    """Tests that share one cluster (cls.slurm) and one work directory
    (cls.work, readable by slurmd), both gone after the last test."""
    prefix = "mercury-slurm-test-"

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix=cls.prefix)
        cls.work = cls.tmp.name
        os.chmod(cls.work, 0o755)
        cls.slurm = SlurmCluster()
        try:
            cls.slurm.__enter__()
        except BaseException:
            cls.tmp.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.slurm.stop()
        cls.tmp.cleanup()


def test_main():
    """A Slurm test file's main: skips (status 77, one line) where Debian's
    slurm-wlm and munge are not installed, else runs the file's tests."""
    missing = missing_programs()
    if missing:
        # .ci/setup installs slurm-wlm and munge; only a machine without them skips.
        print("SKIP: no " + ", ".join(missing) + " (Debian's slurm-wlm and munge)")
        sys.exit(77)
    stop_on_sigterm()
    unittest.main(argv=[sys.argv[0]], verbosity=2)
