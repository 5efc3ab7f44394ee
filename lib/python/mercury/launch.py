"""mercury.launch: run a whole job on this machine, one process per node.

Starts ``ps-server`` for every server node of the job file, then one trainer
process per worker node, streams every process's output, and stops the
servers (SIGINT) once every worker has exited::

    /usr/bin/python3 -m mercury.launch --job config/digits.yaml \\
        --server build/apps/ps-server -- train.py --epochs 5

runs ``train.py --epochs 5`` for each worker ``wN`` with ``MERCURY_JOB`` and
``MERCURY_NODE=wN`` in its environment, where ``mercury.Worker()`` finds
them: the trainer takes no Mercury arguments. :func:`run_job` is the same
from Python, and can also run each worker as a fork of the calling process
(``worker_main``), so that what the trainer imports (torch: about a second
of CPU per process) is imported once. On a cluster the cluster's launcher
(srun, torchrun, mpirun) starts the processes instead (docs/cluster.md).

``--max-restarts K`` starts a worker that died (a non-zero status or a
signal) again, at most K times per worker, with ``MERCURY_RESTART=n`` (its
n-th restart) in its environment: under asp, ssp and psplus the new process
joins the running job in place of the rank the servers removed
(docs/membership.md, "Joining").

A job file's spare workers (``spare: true``) are started with the ranks, with
the same command (their rank, given to ``worker_argv`` and ``worker_main``, is
-1: a spare learns the one it takes over when its start() returns); each waits
until a removed rank is given to it, or the job's end releases it (status 0;
docs/membership.md, "Spare workers").
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence

__all__ = ["run_job", "job_nodes", "main"]


def job_nodes(job: str) -> Dict[str, List[str]]:
    """The job file's node names by role: {"server": [...], "worker": [...],
    "spare": [...]}, the ranks in rank order and the spare workers in file order,
    read by Mercury's loader (mercury.load_job; a file it refuses raises
    mercury.JobError naming the file, line and key)."""
    from . import load_job

    j = load_job(job)
    return {"server": j.servers, "worker": j.workers, "spare": j.spares}


def _node_env(env: Optional[Dict[str, str]], job: str, node: str) -> Dict[str, str]:
    """A worker's environment: ``env`` (default: this process's) with the job
    file and its node, which mercury.Worker() reads (docs/cluster.md)."""
    out = dict(os.environ if env is None else env)
    out["MERCURY_JOB"] = os.path.abspath(job)
    out["MERCURY_NODE"] = node
    return out


class _Forked:
    """A worker forked from this process, as much of a Popen as run_job uses: it
    waits for go() (the servers listen), runs main(node, rank) with its output
    on a pipe, and exits with what main returned (a traceback and 1 if it raised)."""

    def __init__(self, main: Callable[[str, int], Any], node: str, rank: int,
                 env: Optional[Dict[str, str]]) -> None:
        out_r, out_w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker; it never returns from here
            rc = 1
            try:
                os.close(out_r)
                os.close(go_w)
                os.dup2(out_w, 1)
                os.dup2(out_w, 2)
                os.close(out_w)
                # New stream objects: the parent's may have been locked by a thread
                # of its own at the fork.
                sys.stdout = open(1, "w", buffering=1, closefd=False)
                sys.stderr = open(2, "w", buffering=1, closefd=False)
                go = os.read(go_r, 1)
                os.close(go_r)
                if go == b"g":  # else the launcher gave up before the servers listened
                    if env is not None:
                        os.environ.clear()
                        os.environ.update(env)
                    got = main(node, rank)
                    rc = 0 if got is None else int(got)
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    rc = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
            except BaseException:  # noqa: B036 (the worker's whole life: report, exit 1)
                traceback.print_exc()
            finally:
                try:
                    # What Python's exit would do for mercury: shut its workers down.
                    mercury = sys.modules.get("mercury")
                    if mercury is not None:
                        mercury._shutdown_live_workers()
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(rc)
        os.close(out_w)
        os.close(go_r)
        self.pid = pid
        self.returncode: Optional[int] = None
        self.stdout = os.fdopen(out_r, "r", buffering=1)
        self._go = go_w

    def go(self) -> None:
        if self._go >= 0:
            try:
                os.write(self._go, b"g")
            except BrokenPipeError:  # it died already: poll() says how
                pass
            os.close(self._go)
            self._go = -1

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Child:
    def __init__(self, name: str, proc: Any, echo: Callable[[str, str], None]) -> None:
        self.name = name
        self.lines: List[str] = []
        self.proc = proc
        self._echo = echo
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            self._echo(self.name, line)

    def finish(self, timeout: Optional[float]) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return rc


def _restart_env(env: Optional[Dict[str, str]], job: str, node: str, n: int) -> Dict[str, str]:
    out = _node_env(env, job, node)
    out["MERCURY_RESTART"] = str(n)
    return out


def _popen(argv: Sequence[str], env: Optional[Dict[str, str]]) -> subprocess.Popen:
    return subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1, env=env)


def run_job(job: str, worker_argv: Optional[Callable[[str, int], Sequence[str]]] = None, *,
            server_bin: str, echo: Optional[Callable[[str, str], None]] = None,
            timeout_s: float = 600.0, server_args: Sequence[str] = (),
            env: Optional[Dict[str, str]] = None,
            worker_main: Optional[Callable[[str, int], Any]] = None,
            survive_worker_loss: bool = False, max_restarts: int = 0) -> Dict[str, int]:
    """Runs the job: servers first, then every worker (the spares too, rank -1).
    Returns every process's exit status by node name (0 = clean). Each worker is either the command
    ``worker_argv(node, rank)`` or, with ``worker_main`` instead, a fork of this
    process that runs ``worker_main(node, rank)`` and exits with what it returns
    (None is 0; an exception prints its traceback and exits 1). The forks are
    made before anything else, so call it with no other thread running (it
    raises RuntimeError otherwise) and no mercury.Worker made in this process;
    what this process imported (torch, the data) is then shared by the workers
    instead of loaded by each. ``env`` is the servers' environment and the
    workers' (default: this process's), to which each worker's gets
    ``MERCURY_JOB`` and ``MERCURY_NODE``. ``echo(node, line)`` receives each output line (default: printed
    as ``node: line``). A worker still running after ``timeout_s`` is killed
    (status -9), as are servers that do not stop within 30 s of SIGINT. Once
    a worker has failed, the others get 15 s to notice (the servers end the
    job for every rank) before they are killed too, unless
    ``survive_worker_loss``: an asynchronous job goes on without a worker that
    died (docs/membership.md), and the others run to their end.
    ``max_restarts`` K: a worker that exits with a non-zero status or a signal
    is started again (the same command, or a new fork that runs
    ``worker_main``) with ``MERCURY_RESTART=n`` in its environment, at most K
    times per worker, each time with a line on this process's output; its
    status is then its last process's. A fork made then copies this
    process's state but not its threads (the output readers, which hold no
    lock a worker takes)."""
    if (worker_argv is None) == (worker_main is None):
        raise ValueError("run_job: give worker_argv or worker_main, one of them")
    if max_restarts < 0:
        raise ValueError(f"run_job: max_restarts must be >= 0, not {max_restarts}")
    if echo is None:
        lock = threading.Lock()

        def echo(node: str, line: str) -> None:
            with lock:
                print(f"{node}: {line}", flush=True)

    nodes = job_nodes(job)
    # The ranks, then the spares (rank -1: none until one is given to it).
    rank_of = {w: r for r, w in enumerate(nodes["worker"])}
    rank_of.update({s: -1 for s in nodes["spare"]})
    names = nodes["worker"] + nodes["spare"]
    workers: List[_Child] = []
    if worker_main is not None:
        if threading.active_count() > 1:
            raise RuntimeError(
                "run_job: worker_main forks this process, which runs other threads ("
                + ", ".join(t.name for t in threading.enumerate()
                            if t is not threading.current_thread())
                + "); a fork copies none of them, and any lock one holds stays locked")
        forks: List[_Forked] = []
        try:
            for w in names:
                forks.append(_Forked(worker_main, w, rank_of[w], _node_env(env, job, w)))
        except BaseException:
            for f in forks:
                f.kill()
                f.wait()
            raise
        # Their output readers are threads: started once every fork is made.
        workers = [_Child(w, f, echo) for w, f in zip(names, forks)]
    status: Dict[str, int] = {}
    servers: List[_Child] = []
    try:
        servers = [_Child(s, _popen([server_bin, "--config", job, "--node", s, *server_args],
                                    env), echo)
                   for s in nodes["server"]]
        # The workers start with the servers: a worker's net_memif port waits
        # for its server's socket and link, and eal.hugepages: auto counts what
        # the processes starting together take (docs/config.md, "Hugepages").
        if worker_argv is not None:
            workers = [_Child(w, _popen(worker_argv(w, rank_of[w]), _node_env(env, job, w)), echo)
                       for w in names]
        else:
            for w in workers:
                w.proc.go()
        deadline = time.monotonic() + timeout_s
        running = list(workers)
        restarts = {w.name: 0 for w in workers}

        def restart(w: _Child, rc: int) -> _Child:
            n = restarts[w.name] = restarts[w.name] + 1
            print(f"launch: {w.name} exited with status {rc}; starting it again "
                  f"(restart {n} of {max_restarts})", flush=True)
            node_env = _restart_env(env, job, w.name, n)
            if worker_argv is not None:
                proc: Any = _popen(worker_argv(w.name, rank_of[w.name]), node_env)
            else:
                proc = _Forked(worker_main, w.name, rank_of[w.name], node_env)
                proc.go()
            return _Child(w.name, proc, echo)

        while running and time.monotonic() < deadline:
            for s in servers:
                if s.proc.poll() not in (None, 0):
                    rc = s.finish(None)  # its reader has every line it wrote
                    raise RuntimeError(f"ps-server {s.name} failed (exit {rc}): "
                                       + (s.lines[-1] if s.lines else "no output"))
            for w in list(running):
                rc = w.proc.poll()
                if rc is None:
                    continue
                status[w.name] = w.finish(None)
                running.remove(w)
                if rc != 0 and restarts[w.name] < max_restarts:
                    again = restart(w, rc)
                    workers[workers.index(w)] = again
                    running.append(again)
                    continue
                if rc != 0 and not survive_worker_loss:
                    deadline = min(deadline, time.monotonic() + 15.0)
            time.sleep(0.05)
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.proc.kill()
                status[w.name] = w.finish(None)
        for s in servers:
            if s.proc.poll() is None:
                s.proc.send_signal(signal.SIGINT)
        for s in servers:
            try:
                status[s.name] = s.finish(30)
            except subprocess.TimeoutExpired:
                s.proc.kill()
                status[s.name] = s.finish(None)
    return status


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m mercury.launch",
        description="Run a Mercury job on this machine: ps-server for each server node, "
                    "the trainer command for each worker node (with MERCURY_JOB and "
                    "MERCURY_NODE in its environment).")
    parser.add_argument("--job", required=True, help="the job file")
    parser.add_argument("--server", required=True, help="the ps-server binary")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="K",
                        help="start a worker that died again, at most K times per worker "
                             "(default 0); under asp, ssp and psplus it joins the running job")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- then the trainer script and its arguments")
    a = parser.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        parser.error("give the trainer command after --")
    if a.max_restarts < 0:
        parser.error(f"--max-restarts {a.max_restarts}: must be >= 0")
    if cmd[0].endswith(".py"):
        cmd = [sys.executable, *cmd]
    status = run_job(a.job, lambda node, rank: cmd, server_bin=a.server, timeout_s=a.timeout,
                     max_restarts=a.max_restarts)
    failed = {n: s for n, s in status.items() if s != 0}
    for n, s in failed.items():
        print(f"launch: {n} exited with status {s}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
