"""The trainer's exponential moving average: over the trainable parameters in fp32 (sharded like them under
FSDP2), updated on the device without a host sync; GigaTrain's decay warmup when asked."""
import logging

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from ..errors import CheckpointError

log = logging.getLogger("giga_train")


WRAPPED = "_checkpoint_wrapped_module."  # activation checkpointing's wrapper in a parameter's name


def _storage(dtype):
    """The average's dtype for a weight built in `dtype`: bf16/fp16 as built (GigaTrain's), else fp32."""
    return dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32


class EMA:
    """The average of `module`'s trainable parameters, kept in fp32 (sharded like them under FSDP2).

    `warmup=False`: a fixed `decay` at every update. `warmup=True`: GigaTrain's schedule
    min((1 + s) / (10 + s), decay), s = updates so far - 1, so the first update copies the weights;
    the count of updates lives on the device and a skipped step does not advance it."""

    def __init__(self, module, decay, warmup=False, optimization_step=0, dtypes=None):
        """`dtypes`: {state dict name: dtype} of the model as get_models built it; a bf16/fp16 weight's
        average is kept (and written) in that dtype, as GigaTrain's EMAModel keeps it; fp32 otherwise. The
        frozen weights and buffers are written in their built dtype too (an engine may have cast them)."""
        self.decay, self.warmup = decay, warmup
        self.names = [n for n, p in module.named_parameters() if p.requires_grad]
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.built = dtypes = {k.replace(WRAPPED, ""): v for k, v in (dtypes or {}).items()}
        # each trained weight's name in the module's state dict, which checkpoints hold (a member's own
        # state_dict may rename its weights: a LoRA wrapper's drops PEFT's adapter name)
        key_of = {id(v): k for k, v in module.state_dict(keep_vars=True).items()}
        self.keys = [key_of.get(id(p), n) for n, p in zip(self.names, self.params)]
        self.shadow = [p.detach().to(_storage(dtypes.get(k.replace(WRAPPED, "")))).clone()
                       for k, p in zip(self.keys, self.params)]
        device = self.params[0].device if self.params else torch.device("cpu")
        self._count = torch.full((), float(optimization_step), dtype=torch.float32, device=device)

    @property
    def optimization_step(self):
        """Updates made so far (skipped steps not counted). Reads the device: call it at checkpoints."""
        return int(self._count.item())

    @optimization_step.setter
    def optimization_step(self, value):
        self._count.fill_(float(value))

    @property
    def config(self):
        """GigaTrain's ema_config.json content for this average."""
        return dict(decay=self.decay, min_decay=0.0, optimization_step=self.optimization_step,
                    update_after_step=0, use_ema_warmup=False, inv_gamma=1.0, power=2 / 3)

    @torch.no_grad()
    def update(self, skip=None):
        """`skip`: None, or a 0-dim device tensor that is 1.0 when this step was skipped on the device;
        the update then has weight 0 (a no-op) without the host reading the flag."""
        current = [p.detach().float() if p.dtype != torch.float32 else p.detach() for p in self.params]
        live = None if skip is None else (skip <= 0).to(torch.float32)
        self._count.add_(1.0 if live is None else live)
        # a bf16/fp16 average is computed in fp32 and rounded once, as GigaTrain's (s.float() * d + p.float() * (1 - d))
        shadow = [s if s.dtype == torch.float32 else s.float() for s in self.shadow]
        if not self.warmup:
            if live is None:
                torch._foreach_lerp_(shadow, current, 1.0 - self.decay)
                return self._store(shadow)
            weight = live * (1.0 - self.decay)
        else:
            # GigaTrain's arithmetic, to the bit: the decay in float64, then shadow * decay + current * (1 - decay),
            # each factor rounded to fp32 (as a Python float multiplying an fp32 tensor is).
            s = (self._count.double() - 1).clamp(min=0)
            decay = torch.where(s <= 0, 0.0, torch.clamp((1 + s) / (10 + s), max=self.decay))
            if live is not None:  # a skipped step: decay 1, weight 0, the average unchanged
                decay = torch.where(live > 0, decay, 1.0)
            keep, take = decay.to(torch.float32), (1 - decay).to(torch.float32)
            torch._foreach_mul_(shadow, keep)
            torch._foreach_add_(shadow, torch._foreach_mul(current, take))
            return self._store(shadow)
        torch._foreach_lerp_(shadow, current, [weight.to(torch.float32)] * len(shadow))
        self._store(shadow)

    def _store(self, computed):
        for s, f in zip(self.shadow, computed):
            if s is not f:
                s.copy_(f)

    def state_dict(self, module):
        """The module's full state with the averaged weights in place of the trained ones, under every
        name a parameter has (a tied weight, e.g. an LM head sharing the embedding, is listed once by
        named_parameters but twice in the state dict: both names get the average). The rest (frozen weights,
        buffers) in the dtype get_models built it in, as GigaTrain's EMAModel holds it: DeepSpeed's bf16/fp16
        module holds cast copies."""
        shadow_of = {id(p): s for p, s in zip(self.params, self.shadow)}
        state = {}
        for k, v in module.state_dict(keep_vars=True).items():
            value = shadow_of.get(id(v), v).detach()
            built = self.built.get(k.replace(WRAPPED, ""))
            if id(v) not in shadow_of and built is not None and value.is_floating_point():
                value = value.to(built)
            state[k] = value
        return state

    def load_state_dict(self, state, optimization_step=None, strict=True, where="the checkpoint"):
        """Averaged weights from a full state dict (and the update count, when given). A weight `state` lacks:
        `strict` stops in one line naming it; otherwise (train.checkpoint_strict=False, as GigaTrain's
        non-strict load) its average starts from the weight as it is now (loaded just before)."""
        missing = [k for k in self.keys if k not in state]
        if missing and strict:
            raise CheckpointError(f"{where}: the EMA lacks {len(missing)} of {len(self.keys)} trained weights"
                                  f" ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); set"
                                  " train.checkpoint_strict=False to start their average from the weights")
        if missing:
            log.warning("resume: %s: the EMA lacks %d of %d trained weights (%s...); their average starts from"
                        " the weights (train.checkpoint_strict=False)", where, len(missing), len(self.keys),
                        missing[0])
        for name, shadow, param in zip(self.keys, self.shadow, self.params):
            if name not in state:
                shadow.copy_(param.detach())
                continue
            full = state[name].to(shadow.device)
            if isinstance(shadow, DTensor):  # sharded (FSDP2): keep this rank's shard of the whole tensor
                full = distribute_tensor(full, shadow.device_mesh, shadow.placements)
            shadow.copy_(full)
        if optimization_step is not None:
            self.optimization_step = optimization_step
