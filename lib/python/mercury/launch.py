"""mercury.launch: run a whole job on this machine, one process per node.

Starts ``ps-server`` for every server node of the job file, waits until each
is listening, then starts one trainer process per worker node, streams every
process's output, and stops the servers (SIGINT) once every worker has exited::

    /usr/bin/python3 -m mercury.launch --job config/digits.yaml \\
        --server build/apps/ps-server -- train.py --epochs 5

runs ``train.py --epochs 5 --job config/digits.yaml --node wN`` for each
worker ``wN``. :func:`run_job` is the same from Python.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

__all__ = ["run_job", "job_nodes", "main"]


def job_nodes(job: str) -> Dict[str, List[str]]:
    """The job file's node names by role: {"server": [...], "worker": [...]}, in
    file order (a worker's rank is its place in the list)."""
    import yaml  # Debian's python3-yaml

    with open(job) as f:
        doc = yaml.safe_load(f)
    nodes: Dict[str, List[str]] = {"server": [], "worker": []}
    for n in (doc or {}).get("nodes") or []:
        role = n.get("role")
        if role not in nodes:
            raise ValueError(f"{job}: node {n.get('name')!r} has role {role!r}")
        nodes[role].append(str(n["name"]))
    if not nodes["server"] or not nodes["worker"]:
        raise ValueError(f"{job}: a job needs at least one server and one worker node")
    return nodes


class _Child:
    def __init__(self, name: str, argv: Sequence[str],
                 echo: Callable[[str, str], None], env: Optional[Dict[str, str]]) -> None:
        self.name = name
        self.lines: List[str] = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1, env=env)
        self._echo = echo
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if "] waiting" in line:  # ps-server's first stats line: listening
                self.ready.set()
            self._echo(self.name, line)

    def finish(self, timeout: Optional[float]) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return rc


def run_job(job: str, worker_argv: Callable[[str, int], Sequence[str]], *,
            server_bin: str, echo: Optional[Callable[[str, str], None]] = None,
            timeout_s: float = 600.0, server_args: Sequence[str] = (),
            env: Optional[Dict[str, str]] = None) -> Dict[str, int]:
    """Runs the job: servers first, then ``worker_argv(node, rank)`` for every
    worker. Returns every process's exit status by node name (0 = clean).
    ``echo(node, line)`` receives each output line (default: printed as
    ``node: line``). A worker still running after ``timeout_s`` is killed
    (status -9), as are servers that do not stop within 30 s of SIGINT. Once
    a worker has failed, the others get 15 s to notice (the servers end the
    job for every rank) before they are killed too."""
    if echo is None:
        lock = threading.Lock()

        def echo(node: str, line: str) -> None:
            with lock:
                print(f"{node}: {line}", flush=True)

    nodes = job_nodes(job)
    servers = [_Child(s, [server_bin, "--config", job, "--node", s, *server_args], echo, env)
               for s in nodes["server"]]
    status: Dict[str, int] = {}
    workers: List[_Child] = []
    try:
        deadline = time.monotonic() + 60
        for s in servers:
            while not s.ready.wait(0.1):
                if s.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"ps-server {s.name} did not come up: "
                                       + (s.lines[-1] if s.lines else "no output"))
        workers = [_Child(w, worker_argv(w, rank), echo, env)
                   for rank, w in enumerate(nodes["worker"])]
        deadline = time.monotonic() + timeout_s
        running = list(workers)
        while running and time.monotonic() < deadline:
            for w in list(running):
                rc = w.proc.poll()
                if rc is None:
                    continue
                status[w.name] = w.finish(None)
                running.remove(w)
                if rc != 0:
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
                    "the trainer command for each worker node (with --job J --node N "
                    "appended).")
    parser.add_argument("--job", required=True, help="the job file")
    parser.add_argument("--server", required=True, help="the ps-server binary")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- then the trainer script and its arguments")
    a = parser.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        parser.error("give the trainer command after --")
    if cmd[0].endswith(".py"):
        cmd = [sys.executable, *cmd]
    status = run_job(a.job, lambda node, rank: [*cmd, "--job", a.job, "--node", node],
                     server_bin=a.server, timeout_s=a.timeout)
    failed = {n: s for n, s in status.items() if s != 0}
    for n, s in failed.items():
        print(f"launch: {n} exited with status {s}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
