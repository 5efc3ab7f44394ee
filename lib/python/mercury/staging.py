"""mercury.staging: moving a model's tensors between where they live (a GPU,
or CPU tensors of another dtype than the wire's) and the host buffers
Mercury reads and writes, with the same completion semantics on every
device.

Mercury's worker reads gradients from, and writes parameters into, host
memory. A tensor that cannot be used in place (a CUDA tensor; a float32
parameter sent as bfloat16 or float16 on the wire) is staged: it gets a
host buffer per direction (pinned memory on CUDA), and

* ``stage_out(src, host, then)``: copies a device tensor into its host
  buffer without blocking the caller (autograd's thread: the copy runs on a
  side stream, or a side thread) and calls ``then()`` once the host buffer
  holds it: mercury.torch pushes the gradient there;
* ``stage_in(host, dst, ticket)``: copies a pulled host buffer into the
  device tensor, and marks ``ticket`` done once ``dst`` may be read by the
  trainer's work queued after ``ticket.wait()``: a forward pre-hook waits
  for it;
* ``drain()``: every ``stage_out`` issued so far is complete (and its
  ``then`` has run): the end of a backward pass waits for it, so the
  trainer may touch ``.grad`` again.

A copy between dtypes converts as ``Tensor.copy_`` does (rounding to
nearest even into bfloat16 and float16, widening exactly back).

Implementations: ``CpuStaging`` (separate host buffers, copies on one side
thread in issue order, completion from that thread) runs in every test;
``CudaStaging`` (pinned buffers, one side stream per direction, CUDA events,
a thread waiting on the events to call ``then``) is chosen for CUDA tensors
when ``torch.cuda.is_available()``. The CUDA implementation has never run:
the machines Mercury is tested on have no GPU (docs/python.md, "Half precision
and staging").
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Optional

import torch

__all__ = ["Staging", "CpuStaging", "CudaStaging", "Ticket", "staging_for"]


class Ticket:
    """One stage_in's completion: ``wait()`` returns once the destination may
    be read (raises if the copy or the transfer before it failed)."""

    __slots__ = ("_done", "_error", "_event")

    def __init__(self) -> None:
        self._done = threading.Event()
        self._error: Optional[BaseException] = None
        self._event: Any = None  # CUDA: the copy's event, waited on by the current stream

    def _complete(self, error: Optional[BaseException] = None, event: Any = None) -> None:
        self._error = error
        self._event = event
        self._done.set()

    def fail(self, error: BaseException) -> None:
        """Completes it with ``error`` (the pull it waited for failed)."""
        self._complete(error)

    def wait(self) -> None:
        self._done.wait()
        if self._error is not None:
            raise self._error
        if self._event is not None:
            torch.cuda.current_stream().wait_event(self._event)


class Staging:
    """The device interface (see the module comment)."""

    def host_buffer(self, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A host buffer of ``like``'s shape in ``dtype`` (contiguous)."""
        raise NotImplementedError

    def stage_out(self, src: torch.Tensor, host: torch.Tensor, then: Callable[[], None]) -> None:
        raise NotImplementedError

    def stage_in(self, host: torch.Tensor, dst: torch.Tensor, ticket: Ticket) -> None:
        raise NotImplementedError

    def drain(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stops its thread (after draining); idempotent."""


class _SideThread:
    """One daemon thread running jobs in issue order; drain() waits for
    every job issued before it. A job's exception is kept and raised by the
    next drain()."""

    def __init__(self, name: str) -> None:
        self._jobs: "queue.SimpleQueue[Optional[Callable[[], None]]]" = queue.SimpleQueue()
        self._issued = 0
        self._done = 0
        self._cond = threading.Condition()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except BaseException as e:  # kept for drain(): the trainer's thread raises it
                with self._cond:
                    self._error = self._error or e
            with self._cond:
                self._done += 1
                self._cond.notify_all()

    def submit(self, job: Callable[[], None]) -> None:
        with self._cond:
            self._issued += 1
        self._jobs.put(job)

    def drain(self) -> None:
        with self._cond:
            target = self._issued
            self._cond.wait_for(lambda: self._done >= target)
            error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()


class CpuStaging(Staging):
    """Host buffers separate from the tensors, copies on one side thread in
    issue order: the CUDA implementation's semantics on a CPU, so that every
    test runs the staged path."""

    def __init__(self) -> None:
        self._side = _SideThread("mercury-staging")

    def host_buffer(self, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(like.shape, dtype=dtype)

    def stage_out(self, src: torch.Tensor, host: torch.Tensor, then: Callable[[], None]) -> None:
        def copy() -> None:
            with torch.no_grad():
                host.copy_(src)
            then()
        self._side.submit(copy)

    def stage_in(self, host: torch.Tensor, dst: torch.Tensor, ticket: Ticket) -> None:
        def copy() -> None:
            try:
                with torch.no_grad():
                    dst.copy_(host)
            except BaseException as e:
                ticket.fail(e)
                raise
            ticket._complete()
        self._side.submit(copy)

    def drain(self) -> None:
        self._side.drain()

    def close(self) -> None:
        self._side.close()


class CudaStaging(Staging):  # never run: no GPU where Mercury is tested
    """Pinned host buffers; device-to-host copies on one side stream and
    host-to-device copies on another, each ordered after the trainer's work
    by a stream wait; a thread waits on each copy's event and then calls
    ``then`` (the push) or completes the ticket (whose wait() makes the
    current stream wait on the event: the forward pass never blocks the
    CPU on the copy)."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._out = torch.cuda.Stream(device=device)
        self._in = torch.cuda.Stream(device=device)
        self._side = _SideThread("mercury-staging-cuda")

    def host_buffer(self, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(like.shape, dtype=dtype, pin_memory=True)

    def stage_out(self, src: torch.Tensor, host: torch.Tensor, then: Callable[[], None]) -> None:
        self._out.wait_stream(torch.cuda.current_stream(self._device))  # the gradient is made
        with torch.cuda.stream(self._out):
            host.copy_(src, non_blocking=True)
            src.record_stream(self._out)  # its memory is not reused before the copy ran
            event = torch.cuda.Event()
            event.record(self._out)

        def complete() -> None:
            event.synchronize()
            then()
        self._side.submit(complete)

    def stage_in(self, host: torch.Tensor, dst: torch.Tensor, ticket: Ticket) -> None:
        # Called once the pull completed (host holds the version); dst is a
        # parameter the trainer's stream may still read from the last
        # forward pass: ordered after it.
        self._in.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(self._in):
            with torch.no_grad():
                dst.copy_(host, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._in)
        ticket._complete(event=event)

    def drain(self) -> None:
        self._side.drain()

    def close(self) -> None:
        self._side.close()


def staging_for(device: torch.device) -> Staging:
    """CudaStaging for a CUDA device when torch.cuda.is_available(), else
    CpuStaging."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"mercury.staging: the tensors are on {device} but "
                               "torch.cuda.is_available() is False")
        return CudaStaging(device)
    return CpuStaging()
