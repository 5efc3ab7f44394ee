"""mercury.torch: train a ``torch.nn.Module`` through Mercury's parameter
servers, with layer-wise overlap of communication and computation.

Three lines change in a training loop::

    import mercury, mercury.torch
    worker = mercury.Worker("config/digits.yaml", "w0")
    model = mercury.torch.DistributedModel(net, worker)     # was: model = net
    for x, y in batches:
        model.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()      # each gradient is pushed as autograd produces it
        model.step()         # was: optimizer.step()

What happens:

* The first forward pass records the order in which the modules run; each
  parameter is declared with the priority of its module's place in it (the
  first layer most urgent), and the job starts: every rank then holds rank
  0's parameters.
* During ``backward()``, the moment autograd has accumulated a parameter's
  gradient, it is copied into the parameter's push buffer and push_pull'ed:
  the last layers go out first, while the first ones are still computing.
  A parameter that received no gradient in a pass pushes zeros when the
  pass ends, so no server waits for it.
* With a server-side optimizer (``training.optimizer`` sgd, momentum or adam
  in the job file), the servers send back the new parameters, written
  straight into the parameters' memory. ``step()`` returns at once; the next
  forward pass waits, module by module (a forward pre-hook), only for that
  module's parameters, so the first layer computes while deeper ones are
  still on the wire. Under asp, ssp and psplus it also marks the versions
  the module reads (Worker.mark_read) as its gradients' base, which the
  servers count their staleness from.
* With ``training.optimizer: sum``, the servers send back the averaged
  gradient; ``step()`` waits for it, writes it into each ``.grad`` and runs
  the local optimizer given to the constructor.
* With a timeline (``MERCURY_TIMELINE=DIR`` or ``Worker(timeline=DIR)``), each
  module's forward pass, each wait for parameters and the backward pass
  between gradients are recorded beside the tensors' transfers.

Limits (refused with an error where they can be detected): CPU float32
parameters only (a CUDA tensor would be staged through pinned host memory:
docs/python.md); one ``backward()`` per step (no gradient accumulation over
several passes, no gradient clipping: the gradient leaves when autograd
produces it; a second backward() in one step raises UsageError, and a pass
that raised is completed with zeros at the next forward, with a warning);
buffers such as BatchNorm's running statistics are not synchronised (each
rank keeps its own); a parameter's arrival is waited for by the module that
owns it, so one used elsewhere too (weights tied across modules,
F.linear(x, other.weight)) needs synchronize() before that use; a parameter
that got no gradient pushes zeros, which momentum and Adam on the server
still apply (torch's optimizers skip a None gradient). Each parameter's
push_pull follows the job's ``training.sync`` (docs/worker.md, "Modes"); the
end-to-end tests of this module run bsp.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from . import Handle, UsageError, Worker

__all__ = ["DistributedModel"]


class DistributedModel(torch.nn.Module):
    """Wraps ``module`` so that its training runs through ``worker``'s job.

    Args:
        module: the model; its trainable parameters must be CPU float32.
        worker: a connected, not yet started mercury.Worker.
        optimizer: the local optimizer over ``module``'s parameters, required
            when the job's ``training.optimizer`` is ``sum`` and refused
            otherwise (the servers apply the job's optimizer; a local one
            would apply every update twice).

    Raises:
        UsageError: a started worker, a parameter that is not CPU float32,
            an optimizer given or missing against the job's optimizer.
    """

    def __init__(self, module: torch.nn.Module, worker: Worker,
                 optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        super().__init__()
        if worker.started:
            raise UsageError("DistributedModel: the worker has started already; the model's "
                             "parameters must be the ones it declares")
        self.module = module
        self._worker = worker
        self._sum = worker.optimizer == "sum"
        self._async = worker.sync != "bsp"
        if self._sum and optimizer is None:
            raise UsageError(
                "DistributedModel: the job's training.optimizer is sum, so the servers return "
                "the averaged gradient; pass the local optimizer that applies it")
        if not self._sum and optimizer is not None:
            raise UsageError(
                f"DistributedModel: the job's training.optimizer is {worker.optimizer}, applied "
                "by the servers; a local optimizer would apply every update twice (use "
                "training.optimizer: sum in the job file to keep a local one)")
        self._optimizer = optimizer
        self._params: List[torch.nn.Parameter] = []
        for name, p in module.named_parameters():
            if not p.requires_grad:
                continue
            if p.device.type != "cpu":
                raise UsageError(
                    f"DistributedModel: parameter {name} is on {p.device}; Mercury moves host "
                    "memory (stage CUDA tensors through pinned CPU copies, docs/python.md)")
            if p.dtype != torch.float32:
                raise UsageError(f"DistributedModel: parameter {name} is {p.dtype}, "
                                 "Mercury moves float32")
            if not p.is_contiguous():
                raise UsageError(f"DistributedModel: parameter {name} is not contiguous")
            self._params.append(p)
        if not self._params:
            raise UsageError("DistributedModel: the module has no trainable parameter")
        self._names = {id(p): n for n, p in module.named_parameters()}
        self._declared = False
        self._keys: Dict[int, int] = {}             # id(param) -> key
        self._pending: Dict[int, Handle] = {}       # key -> the step's push_pull
        self._grad: Dict[int, torch.Tensor] = {}    # key -> push buffer
        self._out: Dict[int, torch.Tensor] = {}     # key -> what the servers return
        self._pushed: set = set()                   # keys pushed in this step
        self._pass_open = False                     # a backward pass has pushed, not ended
        self._hooks: List[Any] = []
        self._grad_accumulators: List[Any] = []     # kept alive: hooks live on them
        self._timeline = False
        self._module_names = {id(m): (n or type(m).__name__) for n, m in module.named_modules()}
        self._forward_begin: Dict[int, int] = {}    # id(module) -> ns, with a timeline
        self._last_gradient_ns = 0
        self._forward_done_ns = 0

    # ---- the forward pass ----

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not self._declared:
            self._declare(args, kwargs)
        if self._pass_open:
            # The last backward pass raised before it ended: what it did not
            # push goes as zeros, or every rank's next step would wait for it.
            warnings.warn("mercury.torch: the previous backward pass did not finish; its "
                          "missing gradients were pushed as zeros", RuntimeWarning)
            self._end_of_pass()
        if not self._sum:
            self._pushed.clear()  # a forward pass starts the next step
        return self.module(*args, **kwargs)

    def _declare(self, args: Any, kwargs: Any) -> None:
        """Orders the parameters by first use in a forward pass (run once in
        eval mode, without gradients, so nothing is learnt or counted),
        declares them and starts the job."""
        owners: Dict[int, torch.nn.Module] = {}
        for m in self.module.modules():
            for p in m.parameters(recurse=False):
                owners.setdefault(id(p), m)
        order: List[torch.nn.Module] = []
        seen = set()

        def record(mod: torch.nn.Module, _inputs: Any) -> None:
            if id(mod) not in seen:
                seen.add(id(mod))
                order.append(mod)

        modes = {id(m): m.training for m in self.module.modules()}
        probes = [m.register_forward_pre_hook(record) for m in self.module.modules()
                  if any(True for _ in m.parameters(recurse=False))]
        try:
            self.module.eval()
            with torch.no_grad():
                self.module(*args, **kwargs)
        finally:
            for h in probes:
                h.remove()
            for m in self.module.modules():
                m.train(modes[id(m)])
        rank_of = {id(m): i for i, m in enumerate(order)}
        never = len(order)  # modules the pass did not call: after every called one
        ordered = sorted(self._params, key=lambda p: rank_of.get(id(owners[id(p)]), never))

        w = self._worker
        for priority, p in enumerate(ordered):
            grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
            if self._sum:
                # Version 0 is rank 0's buffer: its parameters, so every rank
                # starts from the same model; later versions are gradients.
                out = p.detach().clone(memory_format=torch.contiguous_format)
                key = w.declare(self._names[id(p)], out, priority)
            else:
                out = p.data  # the servers write the new parameters here
                key = w.declare(self._names[id(p)], out, priority)
            self._keys[id(p)] = key
            self._grad[key] = grad
            self._out[key] = out
        w.start()
        if self._sum:
            with torch.no_grad():
                for p in self._params:
                    p.copy_(self._out[self._keys[id(p)]])

        # Gradients: a hook on each parameter's AccumulateGrad node runs once
        # its gradient is complete in .grad for this pass.
        with torch.enable_grad():  # the first call may come under no_grad
            for p in self._params:
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(self._gradient_hook(p))
                self._grad_accumulators.append(acc)
        # Parameters: each module waits for its own before it runs.
        self._timeline = w.timeline_enabled
        for m in self.module.modules():
            keys = [self._keys[id(p)] for p in m.parameters(recurse=False) if id(p) in self._keys]
            if keys and not self._sum:
                self._hooks.append(m.register_forward_pre_hook(self._waiter(keys)))
            if self._timeline and (keys or m is self.module):
                if self._sum or not keys:
                    self._hooks.append(m.register_forward_pre_hook(self._forward_began))
                self._hooks.append(m.register_forward_hook(self._forward_ended))
        self._declared = True

    def _waiter(self, keys: List[int]) -> Any:
        def wait(mod: torch.nn.Module, _inputs: Any) -> None:
            begin = time.monotonic_ns() if self._timeline else 0
            waited = False
            for k in keys:
                h = self._pending.pop(k, None)
                if h is not None:
                    h.wait()
                    waited = True
            if self._async:
                # The versions this module computes with: its gradients' base
                # (under psplus newer ones than the pull's land meanwhile).
                for k in keys:
                    self._worker.mark_read(k)
            if self._timeline:
                now = time.monotonic_ns()
                if waited:
                    self._worker.timeline_span(self._module_names[id(mod)], "wait", begin, now)
                self._forward_begin[id(mod)] = now
        return wait

    def _forward_began(self, mod: torch.nn.Module, _inputs: Any) -> None:
        self._forward_begin[id(mod)] = time.monotonic_ns()

    def _forward_ended(self, mod: torch.nn.Module, _inputs: Any, _output: Any) -> None:
        begin = self._forward_begin.pop(id(mod), None)
        if begin is not None:
            now = time.monotonic_ns()
            self._worker.timeline_span(self._module_names[id(mod)], "forward", begin, now)
            if mod is self.module:
                self._forward_done_ns = now

    # ---- the backward pass ----

    def _gradient_hook(self, p: torch.nn.Parameter) -> Any:
        key = self._keys[id(p)]

        def on_gradient(*_unused: Any) -> None:
            if key in self._pushed:
                raise UsageError(
                    f"mercury.torch: {self._names[id(p)]} received a second gradient in one "
                    "step: one backward pass per step (a forward pass starts the next step; "
                    "with optimizer sum, step() does)")
            if not self._pass_open:
                self._pass_open = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_pass)
                # The first gradient's span starts where the forward pass
                # ended (it includes the loss).
                self._last_gradient_ns = self._forward_done_ns or time.monotonic_ns()
            self._settle(key)
            self._grad[key].copy_(p.grad)
            self._push(key)
            if self._timeline:
                # The backward work since the previous gradient produced this one.
                now = time.monotonic_ns()
                self._worker.timeline_span(self._names[id(p)], "backward",
                                           self._last_gradient_ns, now)
                self._last_gradient_ns = now
        return on_gradient

    def _settle(self, key: int) -> None:
        """Waits for the key's previous transfer, if still in flight (its
        module did not run since), before its push buffer is overwritten."""
        h = self._pending.pop(key, None)
        if h is not None:
            h.wait()

    def _push(self, key: int) -> None:
        self._pushed.add(key)
        self._pending[key] = self._worker.push_pull(key, self._grad[key], self._out[key])

    def _end_of_pass(self) -> None:
        """Every parameter the pass gave no gradient pushes zeros, as its
        gradient is: a BSP server waits for every rank's every tensor."""
        for p in self._params:
            key = self._keys[id(p)]
            if key not in self._pushed:
                self._settle(key)
                self._grad[key].zero_()
                self._push(key)
        self._pass_open = False

    # ---- the step ----

    def step(self) -> None:
        """Ends the step. With a server-side optimizer there is nothing to do
        here (the next forward pass waits module by module). With ``sum``,
        waits for every averaged gradient, writes it into ``.grad`` and runs
        the local optimizer."""
        if not self._sum:
            return
        with torch.no_grad():
            for p in self._params:
                key = self._keys[id(p)]
                h = self._pending.pop(key, None)
                if h is None:
                    raise UsageError("mercury.torch: step() without a backward pass before it")
                h.wait()
                if p.grad is None:
                    p.grad = self._out[key].clone()
                else:
                    p.grad.copy_(self._out[key])
        self._pushed.clear()
        self._optimizer.step()

    def synchronize(self) -> None:
        """Waits for every transfer in flight, so the parameters (with a
        server-side optimizer) are the newest version: before evaluating on
        another thread, saving a checkpoint, or leaving."""
        for h in list(self._pending.values()):
            h.wait()  # kept: a forward pre-hook or step() still takes it
