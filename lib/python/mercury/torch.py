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
  A parameter that received no gradient in a step pushes zeros when the
  pass ends, so no server waits for it.
* Accumulation: inside ``with model.no_sync():`` (as DDP's) a backward pass
  only accumulates into ``.grad``; the first pass outside pushes the sum.
  ``backward_passes_per_step=K`` does the same for K passes (Horovod's).
* With a server-side optimizer (``training.optimizer`` sgd, momentum, adam or adamw
  in the job file), the servers send back the new parameters, written
  straight into the parameters' memory. ``step()`` returns at once; the next
  forward pass waits, module by module (a forward pre-hook), only for that
  module's parameters, so the first layer computes while deeper ones are
  still on the wire. Under asp, ssp and psplus it also marks the versions
  the module reads (Worker.mark_read) as its gradients' base, which the
  servers count their staleness from.
* Its hyperparameters are the trainer's: ``model.optimizer`` (the torch
  optimizer handed to the constructor, or one made from the job file) holds
  them in its param group, any ``torch.optim.lr_scheduler`` drives it, and
  ``model.set_lr(x)`` sets the rate; what changed goes to the servers
  before the step's first push (rank 0's is the job's; under bsp every
  shard applies it from that step on). ``optimizer.step()`` applies nothing
  locally: the servers did.
* ``update="at_step"`` (bsp) applies the servers' optimizer at
  ``optimizer.step()`` instead: backward() leaves the average in ``.grad``
  (the servers only reduce), the trainer unscales (GradScaler) and clips
  (clip_grad_norm_) as under DDP, and step() sends the final ``.grad`` to
  the servers' optimizer, which applies rank 0's (every rank's the same
  bits); a GradScaler's skipped step (its verdict taken in step()) applies
  nothing. A second round trip per step.
* Under asp, ssp and psplus a restarted process (or a spare worker that
  took a removed rank over) joins the running job: its first forward pass
  starts from every chunk's newest version, and ``joined_version`` says the
  step to go on from, for the trainer to reload its data position; a
  spare's rank (``Worker.rank``) is known from then on.
* ``state_dict()`` holds every shard's parameters, optimizer state and
  versions (pulled from the servers); ``load_state_dict()`` before the first
  forward pass makes the job resume from them, bit for bit.
* With ``training.optimizer: sum``, the servers send back the averaged
  gradient: the step's last ``backward()`` returns once every averaged
  gradient is in ``.grad`` (as under DDP), so the trainer may unscale
  (GradScaler) and clip (clip_grad_norm_) before ``optimizer.step()``, or
  ``model.step()``, runs the local optimizer given to the constructor.
* Buffers (BatchNorm's running statistics) follow ``buffers=``: each rank's
  own (None), rank 0's (``"broadcast"``, DDP's default) or the ranks'
  average (``"average"``), made the same on every rank once per step.
* With a timeline (``MERCURY_TIMELINE=DIR`` or ``Worker(timeline=DIR)``), each
  module's forward pass, each wait for parameters and the backward pass
  between gradients are recorded beside the tensors' transfers.

Half precision and GPUs: a bfloat16 or float16 module travels as it is;
``wire_dtype=`` sends a float32 module's tensors as bfloat16 or float16;
CUDA tensors and converted ones are staged through host buffers
(mercury.staging; docs/python.md, "Half precision and staging").

Limits (refused with an error where they can be detected): float32, bfloat16 and float16 parameters and
buffers on one device; a second backward pass in a step outside
no_sync() or backward_passes_per_step raises UsageError, and a pass that
raised is completed at the next forward, with a warning; with a server-side
optimizer applied per chunk (the default) the averaged gradient never
reaches the trainer, so clipping it (clip_grad_norm_) and loss scaling (a
GradScaler) need optimizer sum or update="at_step": the handed optimizer's
step() raises UsageError, naming update="at_step", when .grad changed after
it was pushed or a GradScaler steps it; a parameter's arrival is waited for by
the module that owns it, so one used elsewhere too (weights tied across
modules, F.linear(x, other.weight)) needs synchronize() before that use; a
parameter that got no gradient pushes zeros, which momentum and Adam on the
server still apply (torch's optimizers skip a None gradient). Each
parameter's push_pull follows the job's ``training.sync`` (docs/worker.md,
"Modes"); the end-to-end tests of this module run bsp.
"""

from __future__ import annotations

import contextlib
import time
import types
import warnings
import weakref
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import torch

from . import SKIP_STEP_BITS, Handle, TransferError, UsageError, Worker, _as_buffer
from .staging import Staging, Ticket, staging_for

__all__ = ["DistributedModel", "ServerOptimizer"]


class ServerOptimizer(torch.optim.Optimizer):
    """The servers' optimizer as torch sees it: one param group over the
    model's parameters holding the job file's hyperparameters (lr,
    momentum, weight_decay, betas, eps), for torch.optim.lr_scheduler to
    drive. DistributedModel makes one when no optimizer is handed to it
    (``model.optimizer``) and sends its values to the servers before each
    step's first push; its step() applies nothing locally."""

    def __init__(self, params: List[torch.nn.Parameter], hyperparameters: Dict[str, float]):
        h = hyperparameters
        super().__init__(params, dict(lr=h["learning_rate"], momentum=h["momentum"],
                                      weight_decay=h["weight_decay"],
                                      betas=(h["beta1"], h["beta2"]), eps=h["epsilon"]))

    def step(self, closure: Any = None) -> None:  # replaced by DistributedModel
        raise UsageError("ServerOptimizer: step() of an optimizer no DistributedModel took")


# The job's training.optimizer and the torch optimizers that state it.
_HANDED = {"sgd": (torch.optim.SGD,), "momentum": (torch.optim.SGD,),
           "adam": (torch.optim.Adam,), "adamw": (torch.optim.AdamW,)}


def _settings_of(group: Dict[str, Any]) -> Dict[str, float]:
    """A param group's hyperparameters as the servers name them."""
    values = {"learning_rate": float(group["lr"]),
              "weight_decay": float(group.get("weight_decay", 0.0))}
    if "momentum" in group:
        values["momentum"] = float(group["momentum"])
    if "betas" in group:
        values["beta1"], values["beta2"] = (float(b) for b in group["betas"])
    if "eps" in group:
        values["epsilon"] = float(group["eps"])
    return values

# DistributedModel's buffers= choices and the server's update rule for each.
_BUFFER_RULES = {"broadcast": "rank0", "average": "average"}
# DistributedModel's update= choices: when the servers' optimizer applies.
_UPDATE_MODES = ("per_chunk", "at_step")


class DistributedModel(torch.nn.Module):
    """Wraps ``module`` so that its training runs through ``worker``'s job.

    Args:
        module: the model; its trainable parameters float32, bfloat16 or
            float16, on the CPU or (staged) one CUDA device.
        worker: a connected, not yet started mercury.Worker.
        optimizer: with ``training.optimizer: sum``, the local optimizer
            over ``module``'s parameters (required). With a server-side
            optimizer, optionally the torch optimizer a DDP script made
            (SGD for sgd and momentum, Adam, AdamW; one param group over
            every trainable parameter): handed to the servers, its param
            group's hyperparameters are theirs from the first step on and
            its step() applies nothing locally. Without one,
            ``model.optimizer`` is a ServerOptimizer of the job file's.
        backward_passes_per_step: K >= 1: every K-th backward pass pushes
            what the K passes accumulated in ``.grad`` (the others push
            nothing). 1 with ``no_sync()`` for DDP's way of doing the same.
        wire_dtype: the dtype the tensors travel in (torch.float32,
            torch.bfloat16 or torch.float16); None: the parameters' own. A
            model whose parameters are bfloat16 or float16 travels as it is,
            with nothing converted; float32 parameters with ``wire_dtype=
            torch.bfloat16`` are what a DDP user of ``bf16_compress_hook``
            has: gradients rounded into bfloat16 on the way out, the
            servers' float32 results rounded once on the way back
            (docs/python.md, "Half precision and staging").
        staging: where tensors that cannot be used in place (CUDA tensors,
            another wire_dtype) are staged: None chooses (mercury.staging:
            CUDA staging for CUDA parameters, else CPU staging when needed),
            ``"cpu"`` stages every tensor through CpuStaging, or a Staging.
        buffers: the module's floating-point buffers (BatchNorm's running
            statistics): None keeps each rank's own, ``"broadcast"`` gives
            every rank rank 0's before each step's next forward pass (DDP's
            ``broadcast_buffers``), ``"average"`` the average over the ranks,
            in rank order. They are pushed once per step, after its last
            backward pass. Integer buffers (``num_batches_tracked``) are left
            alone: they count the same steps on every rank.
        update: with a server-side optimizer, when it applies.
            ``"per_chunk"`` (the default): each chunk as soon as its average
            is complete, overlapped with the push; nothing may act on the
            averaged gradient. ``"at_step"``: backward() leaves the average
            in ``.grad`` (the servers only reduce), the trainer may unscale,
            clip or skip as under DDP, and the handed optimizer's step()
            sends the final ``.grad`` (every rank's the same bits), to which
            the servers apply the optimizer; a GradScaler's skipped step, or
            skip_step(), or no step() before the next forward pass, applies
            nothing. BSP only; a second round trip per step.

    Raises:
        UsageError: a started worker, a parameter or buffer that is not CPU
            float32, no optimizer with sum, a handed optimizer that does not
            state the job's (its kind, an option the servers do not have,
            param groups), a bad K, an unknown buffers= rule, update=
            "at_step" with sum or outside bsp.
    """

    def __init__(self, module: torch.nn.Module, worker: Worker,
                 optimizer: Optional[torch.optim.Optimizer] = None, *,
                 backward_passes_per_step: int = 1, buffers: Optional[str] = None,
                 update: str = "per_chunk", wire_dtype: Optional[torch.dtype] = None,
                 staging: Any = None) -> None:
        super().__init__()
        if worker.started:
            raise UsageError("DistributedModel: the worker has started already; the model's "
                             "parameters must be the ones it declares")
        self.module = module
        self._worker = worker
        self._sum = worker.optimizer == "sum"
        self._async = worker.sync != "bsp"
        self._eager = worker.sync == "psplus"  # the servers send every version (eager pull)
        self._at_step = self._update_mode(update)
        # The averages come back into .grad at the end of the step's last pass.
        self._collects = self._sum or self._at_step
        if self._sum and optimizer is None:
            raise UsageError(
                "DistributedModel: the job's training.optimizer is sum, so the servers return "
                "the averaged gradient; pass the local optimizer that applies it")
        if isinstance(backward_passes_per_step, bool) or \
                not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise UsageError(f"DistributedModel: backward_passes_per_step must be an int >= 1, "
                             f"not {backward_passes_per_step!r}")
        self._params: List[torch.nn.Parameter] = []
        trainable = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if self._at_step and (staging is not None or wire_dtype not in (None, torch.float32) or
                              any(p.dtype != torch.float32 or p.device.type != "cpu"
                                  for _, p in trainable)):
            raise UsageError("DistributedModel: update=\"at_step\" takes float32 parameters "
                             "used in place: not a half-precision or CUDA model, wire_dtype or "
                             "staging")
        self._staging = self._staging_for(trainable, wire_dtype, staging)
        self._wire_dtype = wire_dtype
        for name, p in trainable:
            self._check_tensor(p, f"DistributedModel: parameter {name}")
            self._params.append(p)
        if not self._params:
            raise UsageError("DistributedModel: the module has no trainable parameter")
        # Settings and checkpoints: with a server-side optimizer, the torch
        # optimizer whose param group holds the servers' hyperparameters
        # (handed over, or made here), what was last sent of them, and a
        # checkpoint's servers' state to resume from.
        if not self._sum:
            if optimizer is None:
                optimizer = ServerOptimizer(self._params, worker.hyperparameters)
            else:
                self._check_handed(optimizer)
            self._take_over(optimizer)
        self._optimizer = optimizer
        self._settings_sent: Optional[Dict[str, float]] = None
        self._settings_handle: Optional[Handle] = None
        self._resume: Optional[bytes] = None
        self._buffers_rule = self._rule_for_buffers(buffers)
        self._synced_buffers: List[Tuple[str, torch.Tensor]] = []
        if self._buffers_rule:
            for name, b in module.named_buffers():
                if b.dtype.is_floating_point:
                    self._check_tensor(b, f"DistributedModel: buffer {name}")
                    self._synced_buffers.append((name, b))
        self._names = {id(p): n for n, p in module.named_parameters()}
        self._tensor_of: Dict[int, torch.Tensor] = {}  # staged: key -> the module's tensor
        self._tickets: Dict[int, Ticket] = {}          # staged: key -> its pull's copy in
        self._declared = False
        self._keys: Dict[int, int] = {}             # id(param or buffer) -> key
        self._buffer_keys: List[Tuple[int, torch.Tensor]] = []  # (key, the module's buffer)
        self._pending: Dict[int, Handle] = {}       # key -> the step's push_pull
        self._grad: Dict[int, torch.Tensor] = {}    # key -> push buffer
        self._out: Dict[int, torch.Tensor] = {}     # key -> what the servers return
        self._bound: Dict[int, Tuple[int, Any, int]] = {}  # key -> its push_pull, checked once
        self._pushed: Set[int] = set()              # keys pushed in this step
        # update="at_step": id(param) -> the parameter's own key (the servers'
        # optimizer on rank 0's push), and that push's buffer by key.
        self._step_keys: Dict[int, int] = {}
        self._step_grad: Dict[int, torch.Tensor] = {}
        # Accumulation: passes that pushed nothing since the last one that did,
        # the keys they gave a gradient, and what the next pass does.
        self._passes_per_step = backward_passes_per_step
        self._passes = 0
        self._accumulated: Set[int] = set()
        self._no_sync = False                       # inside no_sync()
        self._sync_at_forward = True                # the last forward pass was outside it
        self._forwarded = False                     # a forward pass since the last push began
        self._pass_open = False                     # a backward pass has begun, not ended
        self._pass_syncs = False                    # ... and pushes at its end
        self._grads_ready = False                   # averaged gradients in .grad, not stepped
        self._hooks: List[Any] = []
        self._grad_accumulators: List[Any] = []     # kept alive: hooks live on them
        self._timeline = False
        self._module_names = {id(m): (n or type(m).__name__) for n, m in module.named_modules()}
        self._forward_begin: Dict[int, int] = {}    # id(module) -> ns, with a timeline
        self._last_gradient_ns = 0
        self._forward_done_ns = 0

    # ---- staging (mercury.staging) ----

    @staticmethod
    def _staging_for(params: List[Tuple[str, torch.nn.Parameter]],
                     wire_dtype: Optional[torch.dtype], staging: Any) -> Optional[Staging]:
        """The Staging every tensor goes through, or None when each is used
        in place (CPU tensors of the wire's dtype)."""
        if wire_dtype not in (None, torch.float32, torch.bfloat16, torch.float16):
            raise UsageError(f"DistributedModel: wire_dtype must be torch.float32, "
                             f"torch.bfloat16 or torch.float16, not {wire_dtype}")
        if isinstance(staging, Staging):
            return staging
        if staging not in (None, "cpu"):
            raise UsageError(f"DistributedModel: staging must be None, 'cpu' or a "
                             f"mercury.staging.Staging, not {staging!r}")
        devices = {p.device for _, p in params}
        if len(devices) > 1:
            raise UsageError(f"DistributedModel: the parameters are on {sorted(map(str, devices))}"
                             "; Mercury stages one device's tensors")
        device = next(iter(devices), torch.device("cpu"))
        converts = wire_dtype is not None and any(p.dtype != wire_dtype for _, p in params)
        if staging == "cpu":
            if device.type != "cpu":
                raise UsageError(f"DistributedModel: staging='cpu' but the parameters are on "
                                 f"{device}")
            return staging_for(device)
        if device.type != "cpu" or converts:
            return staging_for(device)
        return None

    def _check_tensor(self, t: torch.Tensor, what: str) -> None:
        """A tensor Mercury can move: in place (a CPU tensor of its dtype), or
        staged (float32, bfloat16 or float16 on any device)."""
        if self._staging is None:
            _as_buffer(t, what)  # used in place: its own dtype is the wire's
        elif t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise UsageError(f"{what}: the tensor is {t.dtype}; Mercury moves float32, "
                             "bfloat16 and float16")

    def _stage_in_on_pull(self, key: int, h: Handle) -> None:
        """Staged, server-side optimizer: once the pull is in, its host
        buffer is copied into the module's tensor; the forward pre-hook
        waits for that copy (self._tickets)."""
        ticket = Ticket()
        self._tickets[key] = ticket
        out, dst = self._out[key], self._tensor_of[key]

        def pulled(done: Handle) -> None:
            if done.ok:
                self._staging.stage_in(out, dst, ticket)
            else:
                ticket.fail(TransferError(done.error))
        h.add_done_callback(pulled)

    def close(self) -> None:
        """Stops the staging thread, if any (after every copy issued)."""
        if self._staging is not None:
            self._staging.close()

    # ---- the servers' optimizer ----

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """With sum, the local optimizer; with a server-side optimizer, the
        one whose param group holds the servers' hyperparameters (handed to
        the constructor, or a ServerOptimizer of the job file's): give it to
        any torch.optim.lr_scheduler."""
        return self._optimizer

    def set_lr(self, lr: float) -> None:
        """Sets every param group's learning rate: with a server-side
        optimizer the servers use it from the next step on (sent now if
        the job has started, else before the first push)."""
        for group in self._optimizer.param_groups:
            group["lr"] = float(lr)
        if self._declared and not self._sum:
            self._sync_settings()

    def _check_handed(self, opt: torch.optim.Optimizer) -> None:
        """Refuses an optimizer the servers cannot be: another kind than the
        job's, options they do not have, several param groups."""
        kind = self._worker.optimizer
        classes = _HANDED.get(kind, ())
        ok = isinstance(opt, ServerOptimizer) or (
            type(opt) in classes and not (kind == "adam" and type(opt) is torch.optim.AdamW))
        if not ok:
            names = " or ".join(f"torch.optim.{c.__name__}" for c in classes)
            raise UsageError(
                f"DistributedModel: the job's training.optimizer is {kind}: hand the servers "
                f"a {names}, not a {type(opt).__name__} (or none: model.optimizer is made from "
                "the job file)")
        if len(opt.param_groups) != 1:
            raise UsageError("DistributedModel: the handed optimizer has "
                             f"{len(opt.param_groups)} param groups; the servers apply one set "
                             "of hyperparameters to every parameter")
        group = opt.param_groups[0]
        if {id(p) for p in group["params"]} != {id(p) for p in self._params}:
            raise UsageError("DistributedModel: the handed optimizer's parameters are not the "
                             "module's trainable parameters")
        refused = [name for name, bad in (
            ("nesterov", group.get("nesterov", False)),
            ("dampening", group.get("dampening", 0) != 0),
            ("amsgrad", group.get("amsgrad", False)),
            ("maximize", group.get("maximize", False))) if bad]
        if refused:
            raise UsageError(f"DistributedModel: the servers' {kind} has no "
                             f"{', '.join(refused)}; the handed optimizer sets it")
        if kind == "sgd" and group.get("momentum", 0) != 0:
            raise UsageError("DistributedModel: the handed SGD has momentum "
                             f"{group['momentum']}, the job's training.optimizer is sgd "
                             "(use momentum)")
        if kind == "momentum" and group.get("momentum", 0) == 0:
            raise UsageError("DistributedModel: the handed SGD has no momentum, the job's "
                             "training.optimizer is momentum")

    def _take_over(self, opt: torch.optim.Optimizer) -> None:
        """The optimizer's step() becomes the servers' (nothing applied
        here); a GradScaler hands itself to it, which is refused there.
        Counted as torch's schedulers count steps, whether they wrapped
        step() before or do so after."""
        model = weakref.ref(self)

        def step(opt_self: torch.optim.Optimizer, closure: Any = None, **kwargs: Any) -> None:
            opt_self._step_count = getattr(opt_self, "_step_count", 0) + 1
            m = model()
            if m is not None:
                m._server_step(closure, kwargs)
        step._with_counter = True  # type: ignore[attr-defined]
        opt.step = types.MethodType(step, opt)  # type: ignore[assignment]
        # A GradScaler hands itself to step(): refused per chunk; at step,
        # its verdict is taken there, on every rank at once (_server_step).
        opt._step_supports_amp_scaling = True  # type: ignore[attr-defined]

    def _server_step(self, closure: Any, kwargs: Dict[str, Any]) -> None:
        """optimizer.step() with a server-side optimizer. Per chunk, the
        update was the servers', made from the gradients as pushed: what
        acts on the averaged gradient after backward() cannot act here, and
        is refused. At step, the final .grad goes to the servers now."""
        if closure is not None:
            raise UsageError("mercury.torch: the servers' optimizer takes no closure")
        if self._at_step:
            scaler = kwargs.get("grad_scaler")
            if scaler is not None and self._scaler_found_inf(scaler):
                self.skip_step()  # an overflow: GradScaler's skip, on every rank
            else:
                self._apply_step()
            return
        if "grad_scaler" in kwargs:
            raise UsageError(
                "mercury.torch: a GradScaler steps the optimizer, but the servers applied it to "
                "each chunk's average as it completed (scaled): construct the DistributedModel "
                "with update=\"at_step\" (docs/python.md, \"Moving from DDP\")")
        with torch.no_grad():
            for p in self._params:
                key = self._keys.get(id(p))
                if key is None or p.grad is None or key not in self._grad:
                    continue
                pushed = self._grad[key]
                if not torch.equal(p.grad.to(pushed.device, pushed.dtype), pushed):
                    raise UsageError(
                        f"mercury.torch: {self._names[id(p)]}'s .grad changed after it was "
                        "pushed (clip_grad_norm_, a GradScaler's unscale_?): the servers "
                        "applied it as pushed; to act on the averaged gradient, construct the "
                        "DistributedModel with update=\"at_step\" (docs/python.md, \"Moving "
                        "from DDP\")")
        self.step()

    def _update_mode(self, update: str) -> bool:
        """Whether update= is "at_step"; refuses what cannot be."""
        if update not in _UPDATE_MODES:
            raise UsageError(f"DistributedModel: update must be one of "
                             f"{', '.join(map(repr, _UPDATE_MODES))}, not {update!r}")
        if update != "at_step":
            return False
        if self._sum:
            raise UsageError("DistributedModel: update=\"at_step\" is for a server-side "
                             "optimizer; with training.optimizer sum the local optimizer "
                             "already steps on the averaged gradient")
        if self._async:
            raise UsageError(f"DistributedModel: update=\"at_step\" needs training.sync bsp "
                             f"(every rank's final gradient the same bits), not "
                             f"{self._worker.sync}")
        return True

    def _scaler_found_inf(self, scaler: Any) -> bool:
        """A GradScaler's verdict on the step, as it would take it itself:
        .grad unscaled first unless the trainer did (unscale_), then whether
        a value was not finite (the scaler's update() backs off from it)."""
        from torch.cuda.amp.grad_scaler import OptState

        state = scaler._per_optimizer_states[id(self._optimizer)]
        if state["stage"] is OptState.READY:
            scaler.unscale_(self._optimizer)
        return any(v.item() for v in state["found_inf_per_device"].values())

    def skip_step(self) -> None:
        """update="at_step": ends the step without an update, as step()
        would end it with one; every rank calls it (a GradScaler's skip calls
        it through step(), and the next forward pass calls it for a step
        that called neither): the servers apply nothing and Adam's t does
        not count the step."""
        if not self._at_step:
            raise UsageError('mercury.torch: skip_step() is for update="at_step"')
        if not self._grads_ready:
            raise UsageError("mercury.torch: skip_step() without a backward pass that pushed "
                             "before it")
        self._skip_step()

    def _apply_step(self) -> None:
        """update="at_step", the step's second half: each parameter's final
        .grad (averaged, then unscaled, clipped or whatever the trainer did)
        to its own key, where the servers apply the optimizer to rank 0's;
        the new parameters arrive in place before the modules' next forward."""
        if not self._grads_ready:
            raise UsageError("mercury.torch: step() without a backward pass that pushed before "
                             "it (inside no_sync(), or before the K-th of "
                             "backward_passes_per_step, a pass only accumulates; or a second "
                             "step() in one step)")
        if _settings_of(self._optimizer.param_groups[0]) != self._settings_sent:
            raise UsageError("mercury.torch: the optimizer's hyperparameters changed between "
                             "backward() and step(); the servers take them at the step's first "
                             "push: change them after step(), as a scheduler does")
        self._grads_ready = False
        with torch.no_grad():
            for p in self._params:
                key = self._step_keys[id(p)]
                self._settle(key)
                if p.grad is None:
                    self._step_grad[key].zero_()
                else:
                    self._step_grad[key].copy_(p.grad)
                self._pending[key] = self._worker.push_pull(key, self._step_grad[key])

    def _skip_step(self) -> None:
        """update="at_step": the averages in .grad were not stepped (a
        GradScaler found an overflow): every parameter's key gets the skip
        marker, so the servers apply nothing and every version stays in step
        (Adam's t does not count it)."""
        self._grads_ready = False
        for p in self._params:
            key = self._step_keys[id(p)]
            self._settle(key)
            self._step_grad[key].view(torch.int32).fill_(SKIP_STEP_BITS)
            self._pending[key] = self._worker.push_pull(key, self._step_grad[key])

    def _sync_settings(self) -> None:
        """Sends the optimizer's param group to the servers if it changed
        since it was last sent (before the step's first push; rank 0's are
        the job's). A refusal from an earlier change is raised here."""
        if self._settings_handle is not None and self._settings_handle.ready():
            self._settings_handle.wait()  # raises TransferError if a server refused it
            self._settings_handle = None
        values = _settings_of(self._optimizer.param_groups[0])
        if values == self._settings_sent:
            return
        self._settings_handle = self._worker.set_hyperparameters(**values)
        self._settings_sent = values

    # ---- checkpoints: the servers' state as the module's extra state ----

    def get_extra_state(self) -> Dict[str, Any]:
        """state_dict()'s part of the servers: every shard's state (a job's
        state file, docs/agg.md), pulled once every transfer in flight is
        in: under bsp, the step boundary this rank reached. None before the
        job started, and with sum (the trainer's own state is the whole)."""
        if self._sum or not self._declared:
            return {"servers": None}
        if self._at_step and self._grads_ready:
            # Only the ranks that save would end the step here; the others
            # would never push theirs, and every rank would wait.
            raise UsageError('mercury.torch: state_dict() between backward() and step() with '
                             'update="at_step": step() or skip_step() first, on every rank')
        self.synchronize()
        state = self._worker.server_state()
        return {"servers": torch.frombuffer(bytearray(state), dtype=torch.uint8)}

    def set_extra_state(self, state: Dict[str, Any]) -> None:
        """load_state_dict()'s part of the servers: before the first forward
        pass, the job resumes from the checkpoint's servers' state (rank 0's
        is the one used; every rank may load the same file)."""
        servers = state.get("servers") if isinstance(state, dict) else None
        if servers is None:
            return
        if self._declared:
            raise UsageError("DistributedModel: load_state_dict() with the servers' state goes "
                             "before the first forward pass, which starts the job from it")
        if self._sum:
            raise UsageError("DistributedModel: the checkpoint holds servers' optimizer state, "
                             "but this job's training.optimizer is sum")
        self._resume = bytes(servers.numpy().tobytes())

    def _rule_for_buffers(self, buffers: Optional[str]) -> str:
        """The servers' update rule for the buffers, or "" to leave them alone."""
        if buffers is None:
            return ""
        rule = _BUFFER_RULES.get(buffers)
        if rule is None:
            raise UsageError(f"DistributedModel: buffers must be None, 'broadcast' or 'average', "
                             f"not {buffers!r}")
        why = self._worker.update_refused(rule)
        if why:
            raise UsageError(f"DistributedModel: buffers={buffers!r}: {why}")
        return rule

    # ---- accumulation ----

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """As DDP's: the backward passes of forward passes run inside it only
        accumulate into ``.grad``; the first one outside pushes the sum."""
        if self._passes_per_step != 1:
            raise UsageError("DistributedModel: no_sync() with backward_passes_per_step > 1: "
                             "choose one way to accumulate")
        before = self._no_sync
        self._no_sync = True
        try:
            yield
        finally:
            self._no_sync = before

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
        if self._at_step and self._grads_ready:
            self._skip_step()  # no step() since the averages came: a skipped step
        if torch.is_grad_enabled():
            # As DDP, whether the coming backward pass pushes is decided here.
            self._sync_at_forward = not self._no_sync
            self._forwarded = True
        if not self._collects:
            self._pushed.clear()  # a forward pass starts the next step
        return self.module(*args, **kwargs)

    def _declare(self, args: Any, kwargs: Any) -> None:
        """Orders the parameters (and synchronised buffers) by first use in a
        forward pass (run once in eval mode, without gradients, so nothing is
        learnt or counted), declares them and starts the job."""
        owners: Dict[int, torch.nn.Module] = {}
        for m in self.module.modules():
            for t in list(m.parameters(recurse=False)) + list(m.buffers(recurse=False)):
                owners.setdefault(id(t), m)
        order: List[torch.nn.Module] = []
        seen = set()

        def record(mod: torch.nn.Module, _inputs: Any) -> None:
            if id(mod) not in seen:
                seen.add(id(mod))
                order.append(mod)

        modes = {id(m): m.training for m in self.module.modules()}
        probes = [m.register_forward_pre_hook(record) for m in self.module.modules()
                  if any(True for _ in m.parameters(recurse=False)) or
                  any(True for _ in m.buffers(recurse=False))]
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
        tensors = [(self._names[id(p)], p, "optimizer") for p in self._params]
        tensors += [(n, b, self._buffers_rule) for n, b in self._synced_buffers]
        # Sorted by the owning module's first use; stable, so a module's
        # parameters come before its buffers.
        tensors.sort(key=lambda t: rank_of.get(id(owners[id(t[1])]), never))

        w = self._worker
        if self._resume is not None:
            w.resume_from(self._resume)  # rank 0's starts the job; the others keep it
            self._resume = None
        for priority, (name, t, rule) in enumerate(tensors):
            if self._staging is not None:
                # Host buffers in the wire's dtype (buffers in their own: a job
                # mixes dtypes freely); version 0 is rank 0's values.
                wire = self._wire_dtype if rule == "optimizer" and self._wire_dtype else t.dtype
                grad = self._staging.host_buffer(t, wire)
                out = self._staging.host_buffer(t, wire)
                with torch.no_grad():
                    out.copy_(t)
                key = w.declare(name, out, priority, update=rule)
                self._tensor_of[key] = t
                self._keys[id(t)] = key
                self._grad[key] = grad
                self._out[key] = out
                self._bound[key] = w._bind(key, grad)
                if rule != "optimizer":
                    self._buffer_keys.append((key, t))
                continue
            grad = torch.zeros_like(t, memory_format=torch.contiguous_format)
            if self._sum:
                # Version 0 is rank 0's buffer: its parameters, so every rank
                # starts from the same model; later versions are gradients.
                out = t.detach().clone(memory_format=torch.contiguous_format)
            else:
                out = t.data  # the servers write the new values here
            if self._at_step and rule == "optimizer":
                # The parameter: the servers' optimizer on rank 0's final
                # gradient, written here. The backward pass pushes to a key
                # of its own whose versions are the averaged gradient.
                step_key = w.declare(name, out, priority, update="optimizer_rank0")
                self._step_keys[id(t)] = step_key
                self._step_grad[step_key] = torch.zeros_like(grad)
                out = torch.zeros_like(grad)
                key = w.declare(name + "#average", out, priority, update="average")
            else:
                key = w.declare(name, out, priority, update=rule)
            self._keys[id(t)] = key
            self._grad[key] = grad
            self._out[key] = out
            self._bound[key] = w._bind(key, grad)
            if rule != "optimizer":
                self._buffer_keys.append((key, t))
        w.start()
        if self._sum or self._staging is not None:
            with torch.no_grad():
                for _, t, _ in tensors:
                    t.copy_(self._out[self._keys[id(t)]])

        # Gradients: a hook on each parameter's AccumulateGrad node runs once
        # its gradient is complete in .grad for this pass; one on the
        # parameter runs before, so that a gradient refused leaves .grad alone.
        with torch.enable_grad():  # the first call may come under no_grad
            for p in self._params:
                self._hooks.append(p.register_hook(self._gradient_coming(p)))
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(self._gradient_hook(p))
                self._grad_accumulators.append(acc)
        # Parameters and buffers: each module waits for its own before it runs.
        self._timeline = w.timeline_enabled
        for m in self.module.modules():
            keys = [self._step_keys.get(id(t), self._keys[id(t)]) for t in
                    list(m.parameters(recurse=False)) + list(m.buffers(recurse=False))
                    if id(t) in self._keys]
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
                ticket = self._tickets.pop(k, None)
                if ticket is not None:
                    ticket.wait()  # its host-to-device copy
            if self._async:
                # The versions this module computes with: its gradients' base
                # (under psplus newer ones than the pull's land meanwhile).
                for k in keys:
                    self._worker.mark_read(k)
                    if self._staging is not None and self._eager:
                        # Staged, they land in the host buffer: copied in now,
                        # so the module computes from (at least) what is marked.
                        ticket = Ticket()
                        self._staging.stage_in(self._out[k], self._tensor_of[k], ticket)
                        ticket.wait()
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

    def _gradient_coming(self, p: torch.nn.Parameter) -> Any:
        key = self._keys[id(p)]

        def before_accumulation(_grad: torch.Tensor) -> None:
            if not self._pass_open:
                self._open_pass()
            if self._pass_syncs and key in self._pushed:
                raise UsageError(
                    f"mercury.torch: {self._names[id(p)]} received a second gradient in one "
                    "step: one backward pass per step pushes (a forward pass starts the next "
                    "step); accumulate with no_sync() or backward_passes_per_step")
        return before_accumulation

    def _gradient_hook(self, p: torch.nn.Parameter) -> Any:
        key = self._keys[id(p)]

        def on_gradient(*_unused: Any) -> None:
            if self._pass_syncs:
                self._settle(key)
                if self._staging is not None:
                    # Copied out on the side stream/thread, pushed once there.
                    self._pushed.add(key)
                    self._staging.stage_out(p.grad, self._grad[key], lambda: self._push(key))
                else:
                    self._grad[key].copy_(p.grad)
                    self._push(key)
            else:
                self._accumulated.add(key)  # it stays in .grad, where the next pass adds to it
            if self._timeline:
                # The backward work since the previous gradient produced this one.
                now = time.monotonic_ns()
                self._worker.timeline_span(self._names[id(p)], "backward",
                                           self._last_gradient_ns, now)
                self._last_gradient_ns = now
        return on_gradient

    def _open_pass(self) -> None:
        """The first gradient of a backward pass: whether it pushes (the last
        pass of a step) is decided once for all of its gradients."""
        syncs = self._sync_at_forward and self._passes + 1 >= self._passes_per_step
        if syncs and not self._forwarded:
            raise UsageError(
                "mercury.torch: a second gradient in one step: a backward pass that pushes "
                "needs a forward pass of its own since the last one (accumulate with no_sync() "
                "or backward_passes_per_step)")
        if self._at_step and self._grads_ready:
            self._skip_step()  # a pass with no forward pass since the averages came
        self._pass_open = True
        self._pass_syncs = syncs
        self._grads_ready = False  # a new pass: the last step's averages are spent
        if syncs:
            self._forwarded = False
            if not self._sum:
                self._sync_settings()  # before the step's first push
        torch.autograd.Variable._execution_engine.queue_callback(self._end_of_pass)
        # The first gradient's span starts where the forward pass ended (it
        # includes the loss).
        self._last_gradient_ns = self._forward_done_ns or time.monotonic_ns()

    def _settle(self, key: int) -> None:
        """Waits for the key's previous transfer, if still in flight (its
        module did not run since), before its push buffer is overwritten."""
        h = self._pending.pop(key, None)
        if h is not None:
            h.wait()
        ticket = self._tickets.pop(key, None)
        if ticket is not None:
            ticket.wait()  # staged: its host buffer copied in before the next pull lands

    def _push(self, key: int) -> None:
        self._pushed.add(key)
        # The step's hot path: the buffers were checked once at declare (_bind); every
        # key's out is its declared buffer.
        h = self._worker._push_pull_bound(self._bound[key])
        if self._staging is not None and not self._sum:
            self._stage_in_on_pull(key, h)
        self._pending[key] = h

    def _end_of_pass(self) -> None:
        """A pass that accumulates only counts. The pass that pushes pushes
        what the step's hooks did not: a parameter's gradient from the
        step's earlier passes, or zeros if it got none (a BSP server waits for
        every rank's every tensor); then the buffers. With optimizer sum it
        waits for the averages and writes them into .grad and the buffers."""
        self._pass_open = False
        if not self._pass_syncs:
            self._passes += 1
            return
        self._passes = 0
        with torch.no_grad():
            for p in self._params:
                key = self._keys[id(p)]
                if key in self._pushed:
                    continue
                self._settle(key)
                if key in self._accumulated and p.grad is not None:
                    self._grad[key].copy_(p.grad)
                else:
                    self._grad[key].zero_()
                self._push(key)
            for key, b in self._buffer_keys:
                self._settle(key)
                self._grad[key].copy_(b)
                self._push(key)
        if self._staging is not None:
            self._staging.drain()  # every gradient copied out and pushed: .grad is free
        self._accumulated.clear()
        if self._collects:
            self._collect()

    def _collect(self) -> None:
        """optimizer sum, update="at_step": every averaged gradient into .grad, every averaged
        (or rank 0's) buffer into the module, as DDP's backward leaves them."""
        with torch.no_grad():
            for p in self._params:
                key = self._keys[id(p)]
                self._pending.pop(key).wait()
                if p.grad is None:
                    p.grad = self._out[key].to(p.device, p.dtype, copy=True)
                else:
                    p.grad.copy_(self._out[key])
            for key, b in self._buffer_keys:
                self._pending.pop(key).wait()
                b.copy_(self._out[key])
        self._pushed.clear()
        self._grads_ready = True

    # ---- the step ----

    def step(self) -> None:
        """Ends the step. With a server-side optimizer there is nothing to do
        here (the next forward pass waits module by module; the handed
        optimizer's step() is this). With ``sum``, runs the local optimizer
        on the averaged gradients, which the step's last backward pass left
        in ``.grad`` (``optimizer.step()`` does the same). With
        update="at_step", sends the final ``.grad`` to the servers' optimizer
        (the handed optimizer's step() does the same)."""
        if self._at_step:
            self._apply_step()
            return
        if not self._sum:
            return
        if not self._grads_ready:
            raise UsageError("mercury.torch: step() without a backward pass that pushed before "
                             "it (inside no_sync(), or before the K-th of "
                             "backward_passes_per_step, a pass only accumulates)")
        self._grads_ready = False
        self._optimizer.step()

    @property
    def joined_version(self) -> Optional[int]:
        """Once the job started (the first forward pass): when this process
        joined a running asp, ssp or psplus job in place of a removed rank
        (a restart, or a spare; docs/membership.md, "Joining"), the step it
        joined at (Worker.joined_version: the slowest rank's): the module's
        parameters hold every chunk's newest version, and the trainer goes on
        from that step of its data; under bsp with on_worker_loss wait, the
        step in progress, whose version the parameters hold. None for a
        process that started with the job."""
        if not self._declared:
            raise UsageError("mercury.torch: joined_version before the first forward pass "
                             "(the job starts there)")
        return self._worker.joined_version

    def roll_back(self) -> int:
        """After a step failed because a server was lost (the job file's
        ``network.on_server_loss: wait``): waits until the server is back
        from its checkpoint, abandons the step that was in flight, and
        returns the version every rank goes on from: the number of steps
        the servers' state holds. The module's parameters (and synced
        buffers) then hold that version; the trainer reloads its data
        position from it (the batches after that many steps) and runs the
        step again. Needs a server-side optimizer: with ``sum`` the local
        optimizer's state is the trainer's to restore. Raises WorkerError if
        the server did not come back within ``network.server_wait_s``."""
        if self._sum:
            raise UsageError("mercury.torch: roll_back() with training.optimizer sum: the "
                             "local optimizer's state is not on the servers; restore it from "
                             "the trainer's own checkpoint")
        version = self._worker.roll_back()
        # What the abandoned step had in flight failed with the server.
        self._pending.clear()
        self._pushed.clear()
        self._accumulated.clear()
        self._passes = 0
        self._forwarded = False
        self._pass_open = False
        self._pass_syncs = False
        return version

    def synchronize(self) -> None:
        """Waits for every transfer in flight. With a server-side optimizer
        the parameters (and buffers) are then the newest version: before
        evaluating on another thread, saving a checkpoint, or leaving. With
        ``sum`` or update="at_step" the step's last backward pass has
        already waited: every averaged gradient is in ``.grad``, ready to be
        unscaled and clipped before ``optimizer.step()``."""
        if self._staging is not None:
            self._staging.drain()
        for h in list(self._pending.values()):
            h.wait()  # kept: a forward pre-hook or step() still takes it
        for t in list(self._tickets.values()):
            t.wait()  # staged: the parameters copied in

