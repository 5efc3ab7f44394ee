"""torch.cuda.amp.GradScaler with its semantics on CPU tensors.

torch 1.13's GradScaler is CUDA-only: constructed without CUDA it disables itself
(every call passes through), and the two kernels it needs
(_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_) have no CPU
implementation. CpuGradScaler is the same class with those two steps and the
device checks done in plain torch operations on the CPU, as the CUDA kernels do
them: unscaling multiplies every gradient by the float32 reciprocal of the scale
and notes a non-finite value; update() backs off by backoff_factor after a step
with one, and grows by growth_factor after growth_interval steps without, unless
the grown scale is not finite. scale(), unscale_(), step(), update(),
get_scale(), state_dict() and load_state_dict() are torch's own, so a training
loop written for torch.cuda.amp.GradScaler runs unchanged with it.
"""

from collections import defaultdict

import torch
from torch.cuda.amp.grad_scaler import GradScaler, _refresh_per_optimizer_state

__all__ = ["CpuGradScaler"]


class CpuGradScaler(GradScaler):
    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        # Built disabled, which skips the CUDA check, then enabled as torch's is.
        super().__init__(init_scale, growth_factor, backoff_factor, growth_interval,
                         enabled=False)
        self._enabled = enabled
        if enabled:
            assert growth_factor > 1.0, "The growth factor must be > 1.0."
            assert backoff_factor < 1.0, "The backoff factor must be < 1.0."
            self._init_scale = init_scale
            self._scale = None
            self._growth_factor = growth_factor
            self._backoff_factor = backoff_factor
            self._growth_interval = growth_interval
            self._init_growth_tracker = 0
            self._growth_tracker = None
            self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    def scale(self, outputs):
        if not self._enabled:
            return outputs
        if not isinstance(outputs, torch.Tensor):
            return type(outputs)(self.scale(o) for o in outputs)
        if self._scale is None:
            self._lazy_init_scale_growth_tracker(outputs.device)
        return outputs * self._scale.to(device=outputs.device)

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is None:
                        continue
                    if not allow_fp16 and param.grad.dtype == torch.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    if not torch.isfinite(param.grad).all():
                        found_inf.fill_(1.0)
                    param.grad.mul_(inv_scale)
        return {found_inf.device: found_inf}

    def update(self, new_scale=None):
        if not self._enabled:
            return
        scale, tracker = self._check_scale_growth_tracker("update")
        if new_scale is not None:
            scale.fill_(float(new_scale))
        else:
            found = sum(v.item() for state in self._per_optimizer_states.values()
                        for v in state["found_inf_per_device"].values())
            if found:
                scale.mul_(self._backoff_factor)
                tracker.fill_(0)
            elif tracker.item() + 1 == self._growth_interval:
                grown = scale * self._growth_factor
                if torch.isfinite(grown).all():
                    scale.copy_(grown)
                tracker.fill_(0)
            else:
                tracker.add_(1)
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
