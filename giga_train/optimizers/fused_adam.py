"""FusedAdam: Adam/AdamW in one fused launch per dtype group, on CUDA (Triton) and CPU (torch's
fused kernel), with optional fp32 master weights for bf16/fp16 parameters.

State keys match torch.optim.AdamW's (`step`, `exp_avg`, `exp_avg_sq`; plus `master_param`), so a
checkpoint moves between the two. AMSGrad and sparse gradients are refused.

`found_inf`: set the attribute to a 0-dim (or 1-element) float32 device tensor before step(); where it is
> 0 the step leaves parameters and all state (step counts included) untouched, decided on the device
(the NaN guard's skip without a host read). Not `_step_supports_amp_scaling`: GradScaler keeps its own path.
"""
import torch

from ..registry import OPTIMIZERS
from .closure import closure_loss
from .kernels import use_kernels
from .kernels.dtensors import local
from .kernels.multi_tensor import advance_steps
from .kernels.state_io import load_state_keep_dtypes

LOW_PRECISION = (torch.bfloat16, torch.float16)


@OPTIMIZERS.register
class FusedAdam(torch.optim.Optimizer):
    """`adam_w_mode=True`: decoupled weight decay (AdamW); False: L2 penalty added to the gradient."""

    supports_found_inf = True  # step() honours `self.found_inf` (see the module docstring)

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, adam_w_mode=True,
                 amsgrad=False, master_weights=False):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support AMSGrad (amsgrad=True); use torch.optim.AdamW(amsgrad=True)")
        if not lr >= 0:
            raise ValueError(f"FusedAdam: lr must be >= 0, got {lr}")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"FusedAdam: betas must be two values in [0, 1), got {betas}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, adam_w_mode=adam_w_mode)
        self.master_weights = bool(master_weights)
        self.backend = "auto"
        self._buckets = {}
        super().__init__(params, defaults)

    def _init_state(self, p, state):
        lp = local(p)
        master = self.master_weights and p.dtype in LOW_PRECISION
        dtype = torch.float32 if master else p.dtype
        state["step"] = torch.zeros((), dtype=torch.float32, device=lp.device)
        state["exp_avg"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
        if master:
            state["master_param"] = p.detach().to(torch.float32, copy=True)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        found_inf = getattr(self, "found_inf", None)
        skips = {}  # device -> 0-dim float32, exactly 1.0 where found_inf > 0 (what torch's fused kernel tests)
        for gi, group in enumerate(self.param_groups):
            buckets = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("FusedAdam does not support sparse gradients; use torch.optim.SparseAdam")
                state = self.state[p]
                if len(state) == 0:
                    self._init_state(p, state)
                key = (local(p).device, p.dtype, p.grad.dtype, state["exp_avg"].dtype, "master_param" in state)
                buckets.setdefault(key, []).append(p)
            for key, params in buckets.items():
                skip = None
                if found_inf is not None:
                    device = key[0]
                    if device not in skips:
                        flag = found_inf.to(device, non_blocking=True).reshape(())
                        skips[device] = (flag > 0).to(torch.float32)
                    skip = skips[device]
                self._step_bucket(gi, key, params, group, skip)
        return loss

    def _step_bucket(self, gi, key, params, group, skip=None):
        states = [self.state[p] for p in params]
        has_master = key[4]
        targets = [local(s["master_param"]) for s in states] if has_master else [local(p) for p in params]
        grads = [local(p.grad) for p in params]
        exp_avgs = [local(s["exp_avg"]) for s in states]
        exp_avg_sqs = [local(s["exp_avg_sq"]) for s in states]
        steps = [s["step"] for s in states]
        b1, b2 = group["betas"]
        args = dict(lr=group["lr"], b1=b1, b2=b2, eps=group["eps"], wd=group["weight_decay"],
                    adam_w_mode=group["adam_w_mode"])
        contiguous = all(t.is_contiguous() for t in targets + grads + exp_avgs + exp_avg_sqs)
        if contiguous and use_kernels(self.backend, targets[0]):
            from .kernels import adam_triton
            cached = self._buckets.get((gi, key))
            ids = tuple(id(p) for p in params)
            if cached is None or cached[0] != ids:
                cached = (ids, adam_triton.AdamBucket([local(p) for p in params], targets[0].device))
                self._buckets[(gi, key)] = cached
            cached[1].step(grads, exp_avgs, exp_avg_sqs, targets if has_master else None, steps, skip=skip, **args)
            return
        self._torch_step(params, targets, grads, exp_avgs, exp_avg_sqs, steps, has_master, skip=skip, **args)

    @staticmethod
    def _torch_step(params, targets, grads, exp_avgs, exp_avg_sqs, steps, has_master, lr, b1, b2, eps, wd,
                    adam_w_mode, skip=None):
        if has_master:
            grads = [g.float() for g in grads]
        advance_steps(steps, skip)
        fused = torch._fused_adamw_ if adam_w_mode else torch._fused_adam_
        fused(targets, grads, exp_avgs, exp_avg_sqs, [], steps, lr=lr, beta1=b1, beta2=b2, weight_decay=wd,
              eps=eps, amsgrad=False, maximize=False, found_inf=skip)
        if has_master:
            torch._foreach_copy_([local(p) for p in params], targets)

    def load_state_dict(self, state_dict):
        """Keeps saved dtypes (fp32 master weights and moments of bf16 params stay fp32)."""
        load_state_keep_dtypes(self, state_dict, super().load_state_dict)
        self._buckets.clear()
