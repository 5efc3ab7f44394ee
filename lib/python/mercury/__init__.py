"""Mercury's worker library for Python: push gradients to Mercury's parameter
servers and pull the aggregated parameters back, over DPDK.

The same worker as the C++ API (``mercury/worker.h``, docs/worker.md), with
the same semantics, threads and errors::

    import numpy as np
    import mercury

    params = np.zeros(1000, dtype=np.float32)
    grad = np.ones(1000, dtype=np.float32)
    with mercury.Worker("config/memif.yaml", "w0") as w:
        key = w.declare("fc.weight", params, priority=0)
        w.start()                        # every rank now holds rank 0's params
        w.push_pull(key, grad).wait()    # params now hold version 1
        w.barrier()

Buffers are the caller's C-contiguous numpy arrays or CPU torch tensors of
the tensor's dtype (DTYPES: float32, bfloat16 or float16; numpy has no
bfloat16, so a bfloat16 tensor is a torch tensor or a uint16 array of its
bits with ``dtype="bfloat16"``), used in place, never converted: a declared buffer receives every new version of its
tensor, chunk by chunk, straight from the network; nothing is copied. The
worker keeps a declared buffer alive; a transfer's Handle keeps its buffers
alive, and a pushed gradient must not change until its handle completes.

Every call that can block releases the GIL. Errors are exceptions carrying
the library's text: :class:`UsageError` for misuse (a ``ValueError``),
:class:`WorkerError` when the worker cannot run (a ``RuntimeError``), and
:class:`TransferError` from :meth:`Handle.wait` when a transfer failed.

``mercury.torch`` wraps a ``torch.nn.Module`` on top of this.

Under a launcher (``srun``, ``torchrun``, ``mpirun``) the job file and the
node come from the environment: ``mercury.Worker()`` with no arguments reads
``MERCURY_JOB`` and finds its node from ``MERCURY_NODE`` or the launcher's
rank (docs/cluster.md). :func:`load_job` reads a job file through the same
C++ loader as every other process.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import weakref
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _mercury

__all__ = ["Worker", "Handle", "UsageError", "WorkerError", "SpareReleased", "TransferError",
           "JobError", "Job", "Node", "load_job", "identify", "launcher"]

UsageError = _mercury.UsageError
WorkerError = _mercury.WorkerError
SpareReleased = _mercury.SpareReleased
"""A spare worker's start: the job ended without needing it (a
:class:`WorkerError`, but no failure: its process ends with status 0;
docs/membership.md, "Spare workers")."""
JobError = _mercury.JobError
"""A job file refused by the loader (a ``ValueError``): its text is
``file:line: key: message``; ``source``, ``line`` and ``key`` are its parts."""


class Node(NamedTuple):
    """One node of a job file, as the loader resolved it."""

    name: str
    role: str      # "server" or "worker"
    index: int     # position in the file's nodes list
    rank: int      # position among the nodes of its role (a spare's: among the spares)
    spare: bool    # a spare worker (docs/membership.md, "Spare workers")
    ipv4: str
    udp_port: int
    mac: Optional[str]
    ports: List[str]
    lcores: List[int]
    shards: int
    poll: str


class Job:
    """A job file read by Mercury's C++ loader (docs/config.md): the same
    allow-list, checks and defaults as ps-server and the worker library.

    Attributes: ``source`` (the path), ``id``, ``name``, ``nodes`` (every
    :class:`Node`, in file order), ``servers`` and ``workers`` (their
    names in rank order; the ranks only), ``spares`` (the spare workers'
    names, in file order), and the sections ``network``, ``eal`` and
    ``training`` as dicts with every default filled in."""

    def __init__(self, resolved: Dict[str, Any]) -> None:
        self.source: str = resolved["source"]
        self.id: int = resolved["id"]
        self.name: str = resolved["name"]
        self.network: Dict[str, Any] = resolved["network"]
        self.eal: Dict[str, Any] = resolved["eal"]
        self.training: Dict[str, Any] = resolved["training"]
        self.nodes: List[Node] = [Node(**n) for n in resolved["nodes"]]
        self.servers: List[str] = [n.name for n in self.nodes if n.role == "server"]
        self.workers: List[str] = [n.name for n in self.nodes
                                   if n.role == "worker" and not n.spare]
        self.spares: List[str] = [n.name for n in self.nodes if n.spare]

    def node(self, name: str) -> Node:
        """The node called ``name``; KeyError if there is none."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"{self.source}: no node called {name!r}")

    def __repr__(self) -> str:
        return (f"Job({self.source!r}: {self.name}, servers {self.servers}, "
                f"workers {self.workers})")


def load_job(path: Union[str, os.PathLike]) -> Job:
    """Reads and checks a job file; raises :class:`JobError` naming the file,
    the line and the key of what is wrong."""
    return Job(_mercury.load_job(os.fspath(path)))


def identify(job: Optional[Union[str, os.PathLike]] = None, node: Optional[str] = None,
             role: str = "worker") -> Tuple[Job, str, str]:
    """Which job and which node of it this process is: ``job`` or
    ``$MERCURY_JOB``; ``node``, ``$MERCURY_NODE``, the launcher's rank
    (``RANK``, ``SLURM_PROCID``, ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``)
    mapped by docs/cluster.md's rule, or the job's only node of ``role``.
    Returns (the job, the node's name, how it was chosen); raises
    :class:`JobError` saying what is missing or does not fit."""
    resolved, name, how = _mercury.identify("" if job is None else os.fspath(job), node or "",
                                            role)
    return Job(resolved), name, how


def launcher() -> Optional[Tuple[int, int, str]]:
    """The launcher's view of this process, (rank, size, "VAR=r of VAR=n"),
    from the first of torchrun's, Slurm's, Open MPI's and PMI's variables
    that is set; None when no launcher started it."""
    return _mercury.launcher()


class TransferError(WorkerError):
    """A push, pull, push_pull or barrier failed; the text names the server
    or says why (a server stopped answering, the worker was shut down)."""


DTYPES = ("float32", "bfloat16", "float16")
"""A tensor's element types (declare()); the servers keep float32 master
parameters and send a half-precision tensor's updates rounded once into its
dtype (docs/python.md, "Element types")."""

UPDATE_RULES = ("optimizer", "average", "rank0", "optimizer_rank0")
"""How the servers may make a tensor's versions from the ranks' pushes (declare())."""

SKIP_STEP_BITS = _mercury.SKIP_STEP_BITS
"""A float32 push whose every element has these bits skips the step of an
``"optimizer_rank0"`` tensor: the servers apply nothing (a signalling NaN,
which no arithmetic produces)."""

Key = Union[int, str]
"""A declared tensor: the int declare() returned, or its name."""


def _expect(what: str, thing: str, has: str, dtype: Optional[str]) -> None:
    """Raises UsageError unless a buffer of dtype `has` is one of `dtype` (None:
    any): nothing converts."""
    if dtype is not None and has != dtype:
        raise UsageError(f"{what}: the {thing} is {has} but {dtype} is expected "
                         "(nothing converts)")


def _as_buffer(x: Any, what: str, dtype: Optional[str] = None) -> Tuple[Any, int]:
    """The object whose buffer the library reads or writes in place, and its
    dtype's code (1 float32, 2 bfloat16, 3 float16): a numpy array as it is
    (float32, float16, or 16-bit integers holding the bits of ``dtype``), a
    CPU torch tensor as its numpy view (same memory; a bfloat16 one as its
    int16 view). ``dtype``: what the buffer must hold (declare's argument,
    or the tensor's for a transfer); None: the array's own."""
    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"{what}: dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise UsageError(
                f"{what}: the tensor is on {x.device}; Mercury reads and writes host memory "
                "(mercury.torch stages it through pinned host buffers, docs/python.md)")
        names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
        has = names.get(x.dtype)
        if has is None:
            raise UsageError(f"{what}: the tensor is {x.dtype}; Mercury moves "
                             "float32, bfloat16 and float16")
        _expect(what, "tensor", has, dtype)
        if not x.is_contiguous():
            raise UsageError(f"{what}: the tensor is not contiguous (use .contiguous() and "
                             "declare that one)")
        x = x.detach()
        view = x.view(torch.int16).numpy() if has == "bfloat16" else x.numpy()
        return view, DTYPES.index(has) + 1
    kind = getattr(getattr(x, "dtype", None), "str", None)  # numpy: '<f4', '<f2', '<u2'...
    if kind is not None:
        own = {"f4": "float32", "f2": "float16"}.get(kind[1:])
        if own is None and kind[1:] in ("u2", "i2"):
            if dtype in ("bfloat16", "float16"):
                return x, DTYPES.index(dtype) + 1
            raise UsageError(f"{what}: an array of 16-bit integers needs "
                             "dtype='bfloat16' or 'float16' (the elements' type)")
        if own is None:
            raise TypeError(f"{what}: the array is {x.dtype}; Mercury moves float32, "
                            "bfloat16 (as uint16 bits) and float16")
        _expect(what, "array", own, dtype)
        return x, DTYPES.index(own) + 1
    # Any other buffer (array.array, memoryview): the library checks its format.
    return x, DTYPES.index(dtype or "float32") + 1


def _run_dispatcher() -> None:
    while True:
        _mercury.run_callbacks()


# One per process, from its first Worker on: it runs completion callbacks and
# releases the buffers of handles dropped before their transfer completed.
# Not at import, so that a process that imported mercury has no thread of
# ours and may still fork (mercury.launch's worker_main).
_dispatcher: Optional[threading.Thread] = None
_dispatcher_lock = threading.Lock()


def _start_dispatcher() -> None:
    global _dispatcher
    with _dispatcher_lock:
        if _dispatcher is None:
            _dispatcher = threading.Thread(target=_run_dispatcher, name="mercury-callbacks",
                                           daemon=True)
            _dispatcher.start()

# Workers still connected when the interpreter exits are shut down first, so
# their net cores stop, their pending handles fail (and their callbacks
# run) and their timelines are written while Python still runs.
_live_workers: "weakref.WeakSet[Worker]" = weakref.WeakSet()


@atexit.register
def _shutdown_live_workers() -> None:
    for w in list(_live_workers):
        try:
            w.shutdown()
        except Exception:  # exiting anyway: a worker that cannot stop is not worth a traceback
            pass


class Handle:
    """The result of a push, pull, push_pull or barrier_async: complete once
    the transfer is. Any thread may wait on it."""

    __slots__ = ("_handle", "__weakref__")

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def wait(self) -> None:
        """Blocks (GIL released) until the transfer completes; raises
        TransferError with the library's text if it failed. Once it returns,
        the pulled bytes are in the output buffer."""
        if not self._handle.wait():
            raise TransferError(self._handle.error())

    def ready(self) -> bool:
        """True once complete, ok or failed; never blocks."""
        return self._handle.ready()

    @property
    def ok(self) -> bool:
        """True if complete and successful."""
        return self._handle.ok()

    @property
    def error(self) -> str:
        """Why it failed; empty unless it did."""
        return self._handle.error()

    def add_done_callback(self, fn: Callable[["Handle"], None]) -> None:
        """Calls ``fn(handle)`` once the transfer completes (at once if it
        has). Callbacks run on one dispatcher thread of the process, in
        completion order, holding the GIL; an exception from one is reported
        as unraisable and does not stop the others."""
        self._handle.add_done_callback(lambda _: fn(self))


class Worker:
    """One worker node of a Mercury job: connects at construction (loads the
    job file, starts DPDK's EAL on the worker's own net core thread, opens
    the node's port). Usable as a context manager, which shuts it down.

    Args:
        job: the job's YAML file (docs/config.md), the same for every node;
            None: ``$MERCURY_JOB``.
        node: this worker's node name in it; its rank is its place among the
            job's workers. None: ``$MERCURY_NODE``, else the node the
            launcher's rank maps to (docs/cluster.md), else the job's only
            worker.
        eal_args: extra EAL arguments, appended to those the job generates.
        start_timeout_ms: how long start() waits for every server and for
            version 0 of every tensor.
        idle_backoff: True (the default) waits as the job file's poll mode
            says (``adaptive`` gives the CPU back to the trainer when idle);
            False polls busily whatever the file says.
        timeline: a directory: at shutdown the worker writes a Chrome trace
            of every tensor's push, aggregation and pull and of the trainer's
            spans to ``DIR/<node>.json``. None: ``$MERCURY_TIMELINE`` if set.

    Raises:
        WorkerError: the job file, the node, EAL or the port failed (the text
            says which).
    """

    def __init__(self, job: Optional[Union[str, os.PathLike]] = None,
                 node: Optional[str] = None, *,
                 eal_args: Sequence[str] = (), start_timeout_ms: int = 30_000,
                 idle_backoff: bool = True,
                 timeline: Optional[Union[str, os.PathLike]] = None) -> None:
        self._w = _mercury.Worker("" if job is None else os.fspath(job), node or "",
                                  list(eal_args), int(start_timeout_ms),
                                  bool(idle_backoff),
                                  "" if timeline is None else os.fspath(timeline))
        _start_dispatcher()
        self._keys: Dict[str, int] = {}
        self._buffers: List[Any] = []
        self._dtypes: List[str] = []
        _live_workers.add(self)

    # ---- declarations ----

    def declare(self, name: str, params: Any, priority: int = -1,
                update: str = "optimizer", dtype: Optional[str] = None) -> int:
        """Declares a tensor whose parameters live in ``params`` (C-contiguous,
        kept alive by the worker) of dtype ``dtype`` (DTYPES): by default the
        array's or tensor's own (float32, float16, torch's bfloat16); a
        uint16 array of bfloat16 bits needs ``dtype="bfloat16"``. Its
        pushes and pulls are then buffers of that dtype. ``priority`` >= 0, 0 the most
        urgent (the first layer of the forward pass), or -1 for the
        declaration index. ``update`` is how the servers make each version
        from the ranks' pushes: ``"optimizer"`` (the job's
        ``training.optimizer``), ``"average"`` (the average in rank order,
        whatever the job's optimizer), ``"rank0"`` (rank 0's push) or
        ``"optimizer_rank0"`` (the job's optimizer applied to rank 0's push,
        not averaged; a push of SKIP_STEP_BITS applies nothing); see
        update_refused(). Returns its key. Raises UsageError: duplicate or
        empty name, empty tensor, bad priority, after start, an update rule
        the servers cannot apply."""
        why = self.update_refused(update)
        if why:
            raise UsageError(f"declare {name!r}: {why}")
        buf, code = _as_buffer(params, f"declare {name!r}", dtype)
        key = self._w.declare(name, buf, code, int(priority), UPDATE_RULES.index(update))
        self._keys[name] = key
        self._buffers.append(buf)
        self._dtypes.append(DTYPES[code - 1])
        return key

    def dtype(self, key: Key) -> str:
        """The dtype ``key`` was declared with (one of DTYPES)."""
        return DTYPES[self._w.dtype(self._key(key)) - 1]

    def start(self) -> None:
        """Freezes the declarations and joins the job: every server agrees on
        the tensors and version 0 (rank 0's buffers as they are now) is in
        every declared buffer when it returns. Implicit in the first push,
        pull, push_pull or barrier. Raises WorkerError naming the server that
        refused or never answered."""
        self._w.start()

    def update_refused(self, update: str) -> str:
        """Why the servers cannot make a tensor's versions by rule ``update``
        (declare()), or "" if they can: every job's servers apply each of
        UPDATE_RULES, the job's optimizer to most tensors and a rule of their
        own to the others."""
        if update not in UPDATE_RULES:
            return f"update must be one of {', '.join(UPDATE_RULES)}, not {update!r}"
        return ""

    # ---- settings and checkpoints ----

    @property
    def hyperparameters(self) -> Dict[str, float]:
        """The servers' optimizer's hyperparameters as this worker last set
        them (the job file's until then): learning_rate, momentum,
        weight_decay, beta1, beta2, epsilon (float32 values)."""
        return dict(self._w.hyperparameters())

    def set_hyperparameters(self, **values: float) -> Handle:
        """Changes the servers' hyperparameters from this worker's next push
        on (those not named keep their values). Rank 0's change is the
        job's: sent to every server, the handle completes once every shard
        applied it, and under bsp rank 0's pushes of that version wait for
        it, so every shard uses it from the same version; another rank's
        is checked and recorded only (one script runs on every rank).
        Raises UsageError: before start, a job whose optimizer is sum, a
        value the optimizer cannot take."""
        return Handle(self._w.set_hyperparameters(dict(values)))

    def server_state(self) -> bytes:
        """Every shard's parameters, optimizer state, versions and the
        hyperparameters, as a job's state file (docs/agg.md, "A job's
        state"). Under bsp, once this worker's pulls are complete, one step
        boundary. Blocks (GIL released); raises WorkerError naming a server
        that failed."""
        return self._w.server_state()

    def resume_from(self, state: bytes) -> None:
        """Before start: the job resumes from ``state`` (server_state()'s
        bytes). On rank 0 the servers start from its values at its version
        instead of rank 0's buffers; on the others it is kept, not used.
        Checked at start (UsageError naming what does not fit)."""
        self._w.resume_from(bytes(state))

    @property
    def start_version(self) -> int:
        """The version the job started at: 0, or the resumed state's; for a
        process that joined a running asynchronous job, the step it joined at
        (its pushes count from it)."""
        return self._w.start_version()

    @property
    def joined_version(self) -> Optional[int]:
        """When this process joined a running job in place of a removed rank
        (a restart or a spare; docs/membership.md, "Joining"): the step it goes
        on from. Under asp, ssp and psplus the slowest rank's step when it
        joined, from which its pushes count (its first pull holds every chunk's
        newest version); under bsp with on_worker_loss wait, the step in
        progress. The trainer goes on from that step of its data. None for a
        process that started with the job. UsageError before start."""
        return self._w.joined_version()

    def roll_back(self) -> int:
        """After a call failed because a server was lost (the job file's
        network.on_server_loss: wait): waits until the server is back from
        its checkpoint and every declared tensor holds the version it
        resumed at, and returns that version, the same on every rank under
        bsp. The trainer goes on from it (reloading its data position: the
        batches after that many steps). Raises WorkerError if the server
        did not come back within network.server_wait_s."""
        return self._w.roll_back()

    # ---- transfers ----

    def _buffer(self, k: int, x: Any, what: str) -> Tuple[Any, int]:
        """A transfer's buffer of tensor ``k`` (None: the declared one), in
        the tensor's dtype."""
        dtype = self._dtypes[k] if 0 <= k < len(self._dtypes) else None
        if x is None:
            if dtype is None:
                raise UsageError(f"{what}: no tensor with key {k}")
            return self._buffers[k], DTYPES.index(dtype) + 1
        return _as_buffer(x, what, dtype)

    def _key(self, key: Key) -> int:
        if isinstance(key, str):
            found = self._keys.get(key)
            if found is None:
                raise UsageError(f"no tensor is declared as {key!r}")
            return found
        return int(key)

    def push(self, key: Key, grad: Any) -> Handle:
        """Pushes the next iteration's gradient of ``key`` (the whole tensor).
        Completes when the servers have acknowledged every byte; ``grad``
        must not change until then."""
        k = self._key(key)
        return Handle(self._w.push(k, *self._buffer(k, grad, "push")))

    def pull(self, key: Key, out: Any = None, min_version: Optional[int] = None) -> Handle:
        """Pulls ``key`` into ``out`` (default: the declared buffer, with no
        copy): under bsp the version this worker's pushes lead to; in the
        other modes what the job's ``training.sync`` says (docs/worker.md,
        "Modes"). With ``min_version``, also not before every chunk of the
        tensor is at least that version."""
        k = self._key(key)
        target = self._buffer(k, out, "pull")
        if min_version is None:
            return Handle(self._w.pull(k, *target))
        return Handle(self._w.pull_min(k, *target, int(min_version)))

    def version(self, key: Key) -> int:
        """The version the last completed pull (or push_pull) of ``key``
        delivered: its version under bsp, the least over its chunks
        otherwise."""
        return self._w.version(self._key(key))

    def mark_read(self, key: Key) -> int:
        """The trainer is about to compute with ``key``'s declared buffer as
        it is now: returns the version in it (the least over its chunks) and,
        under asp, ssp and psplus, takes it as the version the next push of
        ``key`` was computed from, which the servers count its staleness
        from (under psplus newer versions land after the pull that delivered
        version()). Call it after waiting for the parameters, right before
        reading them. Under bsp it returns version() and changes nothing."""
        return self._w.mark_read(self._key(key))

    def push_pull(self, key: Key, grad: Any, out: Any = None) -> Handle:
        """push(key, grad), then pull of the version it leads to into ``out``
        (default: the declared buffer); completes when both have."""
        k = self._key(key)
        g, code = self._buffer(k, grad, "push_pull (grad)")
        target, _ = self._buffer(k, out, "push_pull (out)")
        return Handle(self._w.push_pull(k, g, target, code))

    def _bind(self, key: Key, grad: Any) -> Tuple[int, Any, int]:
        """push_pull's arguments for a caller that pushes the same ``grad`` into the
        declared buffer every step (mercury.torch), checked once here:
        _push_pull_bound() then skips the per-call checks and views."""
        k = self._key(key)
        g, code = self._buffer(k, grad, "push_pull (grad)")
        return k, g, code

    def _push_pull_bound(self, bound: Tuple[int, Any, int]) -> Handle:
        """push_pull(key, grad) with _bind()'s arguments, into the declared buffer."""
        k, g, code = bound
        return Handle(self._w.push_pull(k, g, self._buffers[k], code))

    def barrier(self) -> None:
        """Blocks until every rank has called barrier() as often as this one.
        Raises WorkerError if it cannot complete."""
        self._w.barrier()

    def barrier_async(self) -> Handle:
        """barrier() without waiting."""
        return Handle(self._w.barrier_async())

    def shutdown(self) -> None:
        """Stops the net core; pending handles fail. Idempotent."""
        self._w.shutdown()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # ---- what the worker knows ----

    def key(self, name: str) -> int:
        """The key of the tensor declared as ``name``."""
        return self._key(name)

    @property
    def rank(self) -> int:
        """This worker's place among the job's workers (file order). A spare
        worker's is the rank it took over, once started (UsageError before;
        docs/membership.md, "Spare workers")."""
        return self._w.rank()

    @property
    def spare(self) -> bool:
        """Whether the job file makes this worker a spare: its start() waits
        until it takes a removed rank over, or raises :class:`SpareReleased`
        when the job ends without needing it."""
        return self._w.spare()

    @property
    def workers(self) -> int:
        """The number of workers in the job."""
        return self._w.workers()

    @property
    def tensors(self) -> int:
        """Tensors declared so far."""
        return self._w.tensors()

    @property
    def started(self) -> bool:
        """True once start() has succeeded."""
        return self._w.started()

    @property
    def sync(self) -> str:
        """The job's ``training.sync``: ``bsp``, ``asp``, ``ssp`` or ``psplus``."""
        return self._w.sync()

    @property
    def optimizer(self) -> str:
        """The job's ``training.optimizer``: with ``sum`` each version is the
        workers' averaged gradient (for the trainer's own optimizer),
        otherwise the parameters, updated by the servers."""
        return self._w.optimizer()

    @property
    def timeline_enabled(self) -> bool:
        """Whether this worker records a timeline."""
        return self._w.timeline_enabled()

    def timeline_span(self, name: str, track: str, begin_ns: int, end_ns: int) -> None:
        """Records a span of the trainer's own work (e.g. a layer's forward
        pass) on row ``track`` of the timeline, in ``time.monotonic_ns()``
        nanoseconds. Does nothing when the timeline is off."""
        self._w.timeline_span(name, track, int(begin_ns), int(end_ns))

    def stats(self) -> Dict[str, int]:
        """The worker's counters (pushes, pulls, bytes, retransmits, drops),
        published by the net core every few milliseconds."""
        return dict(self._w.stats())
