"""GigaTrain's value schedulers: a value per optimizer step, blended from start_value and end_value.

`get_value(n)` = start_value * a + end_value * b, where (a, b) = `get_factor(n)` and n is the number
of optimizer steps taken. Wrapped in LambdaLR (build_scheduler), the value multiplies each group's base lr.
Ours besides GigaTrain's: WarmupLinearScheduler and ConstantScheduler(warmup_steps=...) (docs/config.md)."""
import math

from ..registry import import_object
from .build import SCHEDULERS


class BaseScheduler:
    def __init__(self, epoch_size=None, max_epochs=None, max_steps=None, start_value=1.0, end_value=0.0):
        self.epoch_size = epoch_size
        self.max_epochs = max_epochs
        self.max_steps = max_steps
        self.start_value = start_value
        self.end_value = end_value

    def get_value(self, num_update):
        if num_update < 0 or (self.max_steps is not None and num_update > self.max_steps):
            raise ValueError(f"{type(self).__name__}: step {num_update} is outside 0..{self.max_steps}")
        start_factor, end_factor = self.get_factor(float(num_update))
        return float(self.start_value * start_factor + self.end_value * end_factor)

    def get_factor(self, num_update):
        """(start factor, end factor) at step `num_update` (a float)."""
        raise NotImplementedError

    def _needs(self, name):
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"{type(self).__name__} needs {name} (the trainer passes it; "
                             f"build_scheduler(cfg, optimizer, {name}=...) when building it yourself)")
        return value

    def _progress(self, num_update):
        """(n - 1) / (max_steps - 1): 0 at step 1, 1 at max_steps."""
        return (num_update - 1) / (self._needs("max_steps") - 1)


def _warmup(num_update, warmup_steps):
    """The warmup factor, or None past the warmup: 1/(w+1) at step 0, then n/w up to step w."""
    if num_update == 0:
        return 1.0 / (warmup_steps + 1)
    if num_update <= warmup_steps:
        return num_update / warmup_steps
    return None


def _check_warmup(warmup_steps):
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")


@SCHEDULERS.register
class FuncScheduler(BaseScheduler):
    """`func(scheduler, n) -> (start factor, end factor)`; a callable or its dotted import path."""

    def __init__(self, func, epoch_size=None, max_epochs=None, max_steps=None, start_value=1.0, end_value=0.0):
        super().__init__(epoch_size, max_epochs, max_steps, start_value, end_value)
        self.func = import_object(func) if isinstance(func, str) else func
        if not callable(self.func):
            raise TypeError(f"FuncScheduler: func must be callable or a dotted path, got {func!r}")

    def get_factor(self, num_update):
        return self.func(self, num_update)


@SCHEDULERS.register
class ConstantScheduler(BaseScheduler):
    """start_value throughout (after `warmup_steps`, ours: 0 by default, GigaTrain has none)."""

    def __init__(self, warmup_steps=0, epoch_size=None, max_epochs=None, max_steps=None, start_value=1.0,
                 end_value=0.0):
        super().__init__(epoch_size, max_epochs, max_steps, start_value, end_value)
        _check_warmup(warmup_steps)
        self.warmup_steps = warmup_steps

    def get_factor(self, num_update):
        if self.warmup_steps > 0:
            factor = _warmup(num_update, self.warmup_steps)
            if factor is not None:
                return factor, 0
        return 1, 0


@SCHEDULERS.register
class LinearScheduler(BaseScheduler):
    def get_factor(self, num_update):
        if num_update == 0:
            return 1, 0
        start = 1 - self._progress(num_update)
        return start, 1 - start


@SCHEDULERS.register
class PolyScheduler(BaseScheduler):
    """method 1: (1 - p) ** power; method 2: 1 - p ** power (p: progress from step 1 to max_steps)."""

    def __init__(self, power=2, method=1, epoch_size=None, max_epochs=None, max_steps=None, start_value=1.0,
                 end_value=0.0):
        super().__init__(epoch_size, max_epochs, max_steps, start_value, end_value)
        if method not in (1, 2):
            raise ValueError(f"PolyScheduler: method must be 1 or 2, got {method!r}")
        self.power, self.method = power, method

    def get_factor(self, num_update):
        if num_update == 0:
            return 1, 0
        progress = self._progress(num_update)
        start = pow(1 - progress, self.power) if self.method == 1 else 1 - pow(progress, self.power)
        return start, 1 - start


@SCHEDULERS.register
class CosineScheduler(BaseScheduler):
    def __init__(self, weight=1.0, epoch_size=None, max_epochs=None, max_steps=None, start_value=1.0,
                 end_value=0.0):
        super().__init__(epoch_size, max_epochs, max_steps, start_value, end_value)
        self.weight = weight

    def get_factor(self, num_update):
        if num_update == 0:
            return 1, 0
        # pi * (n - 1) / (max_steps - 1), in this order: the float rounding is GigaTrain's
        start = 0.5 * self.weight * (1 + math.cos(math.pi * (num_update - 1) / (self._needs("max_steps") - 1)))
        return start, 1 - start


@SCHEDULERS.register
class WarmupCosineScheduler(BaseScheduler):
    """Warmup to start_value over `warmup_steps`, cosine to end_value at step `decay_steps` (counted
    from the start of training, warmup included), end_value after."""

    def __init__(self, warmup_steps, decay_steps, epoch_size=None, max_epochs=None, max_steps=None,
                 start_value=1.0, end_value=0.0):
        super().__init__(epoch_size, max_epochs, max_steps, start_value, end_value)
        _check_warmup(warmup_steps)
        self.warmup_steps, self.decay_steps = warmup_steps, decay_steps

    def _decay(self, alpha):
        return 0.5 * (1 + math.cos(math.pi * alpha))

    def get_factor(self, num_update):
        factor = _warmup(num_update, self.warmup_steps)
        if factor is not None:
            return factor, 0
        if num_update <= self.decay_steps:
            factor = self._decay((num_update - self.warmup_steps) / (self.decay_steps - self.warmup_steps))
            return factor, 1 - factor
        return 0, 1


@SCHEDULERS.register
class WarmupLinearScheduler(WarmupCosineScheduler):
    """Ours: as WarmupCosineScheduler, with a linear decay."""

    def _decay(self, alpha):
        return 1 - alpha


@SCHEDULERS.register
class CycleScheduler(BaseScheduler):
    """Cyclical values (Smith, "Cyclical Learning Rates for Training Neural Networks"): from start_value
    to end_value and back every 2 * (step_size - 1) steps. `step_size`, or `step_epoch` epochs."""

    def __init__(self, mode="triangular", gamma=1, step_size=0, step_epoch=0, epoch_size=None, max_epochs=None,
                 max_steps=None, start_value=1.0, end_value=0.0):
        super().__init__(epoch_size, max_epochs, max_steps, start_value, end_value)
        if mode not in ("triangular", "triangular2", "exp_range"):
            raise ValueError(f"CycleScheduler: mode must be triangular, triangular2 or exp_range, got {mode!r}")
        if step_size > 0:
            if step_epoch != 0:
                raise ValueError("CycleScheduler: give step_size or step_epoch, not both")
        elif step_epoch > 0:
            step_size = int(step_epoch * self._needs("epoch_size"))
        else:
            raise ValueError("CycleScheduler needs step_size > 0 or step_epoch > 0")
        self.mode, self.gamma, self.step_size = mode, gamma, step_size

    def get_factor(self, num_update):
        if num_update == 0:
            return 1, 0
        cycle = math.floor(1 + (num_update - 1) / (2 * (self.step_size - 1)))
        x = abs((num_update - 1) / (self.step_size - 1) - 2 * cycle + 1)
        end = max(0, 1 - x)
        if self.mode == "triangular2":
            end *= 1 / pow(2, cycle - 1)
        elif self.mode == "exp_range":
            end *= pow(self.gamma, num_update - 1)
        return 1 - end, end


@SCHEDULERS.register
class StepScheduler(BaseScheduler):
    """start_value * step_factor ** (milestones passed); milestones in steps (`step_size_list`) or
    epochs (`step_epoch_list`). A milestone s takes effect from step s + 1."""

    def __init__(self, step_factor=0.1, step_size_list=None, step_epoch_list=None, epoch_size=None,
                 max_epochs=None, max_steps=None, start_value=1.0, end_value=0.0):
        super().__init__(epoch_size, max_epochs, max_steps, start_value, end_value)
        if step_size_list is not None:
            if step_epoch_list is not None:
                raise ValueError("StepScheduler: give step_size_list or step_epoch_list, not both")
        elif step_epoch_list is not None:
            epoch_size = self._needs("epoch_size")
            step_size_list = [int(s * epoch_size) for s in step_epoch_list]
        else:
            raise ValueError("StepScheduler needs step_size_list or step_epoch_list")
        self.step_factor, self.step_size_list = step_factor, list(step_size_list)

    def get_factor(self, num_update):
        if num_update == 0:
            return 1, 0
        passed = sum(1 for s in self.step_size_list if s <= num_update - 1)
        return pow(self.step_factor, passed), 0
