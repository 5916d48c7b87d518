"""Per-optimizer-step learning-rate schedules, as multipliers of each group's base lr.

warmup_steps: linear from 0 to 1; then over decay_steps from 1 to end_value (cosine or linear);
afterwards held at end_value."""
import math

from torch.optim.lr_scheduler import LRScheduler

from ..registry import SCHEDULERS


class _Multiplier(LRScheduler):
    def __init__(self, optimizer, warmup_steps=0, last_epoch=-1):
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.warmup_steps = warmup_steps
        super().__init__(optimizer, last_epoch)

    def multiplier(self, step):
        raise NotImplementedError

    def get_lr(self):
        step = self.last_epoch
        if step < self.warmup_steps:
            factor = (step + 1) / (self.warmup_steps + 1)
        else:
            factor = self.multiplier(step - self.warmup_steps)
        return [base * factor for base in self.base_lrs]


@SCHEDULERS.register
class ConstantScheduler(_Multiplier):
    def multiplier(self, step):
        return 1.0


class _Decay(_Multiplier):
    def __init__(self, optimizer, warmup_steps=0, decay_steps=1, end_value=0.0, last_epoch=-1):
        if decay_steps < 1:
            raise ValueError(f"decay_steps must be >= 1, got {decay_steps}")
        self.decay_steps, self.end_value = decay_steps, end_value
        super().__init__(optimizer, warmup_steps, last_epoch)

    def progress(self, step):
        return min(step / self.decay_steps, 1.0)


@SCHEDULERS.register
class WarmupCosineScheduler(_Decay):
    def multiplier(self, step):
        return self.end_value + (1 - self.end_value) * 0.5 * (1 + math.cos(math.pi * self.progress(step)))


@SCHEDULERS.register
class WarmupLinearScheduler(_Decay):
    def multiplier(self, step):
        return 1 - (1 - self.end_value) * self.progress(step)
