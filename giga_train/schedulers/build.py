"""build_scheduler: a value scheduler from SCHEDULERS, wrapped in torch's LambdaLR (GigaTrain's form).

The value scheduler gives a multiplier of each param group's base lr for the number of optimizer
steps taken so far, so the first step runs at `get_value(0)` (with warmup: 1 / (warmup_steps + 1)).
A torch LRScheduler class (registered, or a dotted path such as `torch.optim.lr_scheduler.StepLR`)
is built on the optimizer directly instead."""
import inspect

from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from ..registry import Registry, RegistryError, build_module, merge_params, pop_type


class SchedulerRegistry(Registry):
    """SCHEDULERS: `build(cfg, optimizer, epoch_size=..., max_epochs=..., max_steps=...)` gives the
    torch scheduler the trainer steps: a value scheduler wrapped in LambdaLR, as build_scheduler does."""

    def build(self, cfg, optimizer=None, *args, **extra):
        cls, kwargs = self.resolve(cfg)
        return wrap_scheduler(cls, kwargs, optimizer, args, extra, merge="fill")


SCHEDULERS = SchedulerRegistry("scheduler")


def wrap_scheduler(cls, kwargs, optimizer, args=(), extra=None, merge="fill"):
    """Build `cls` and wrap it for `optimizer`.

    `extra` are the trainer's arguments (epoch_size, max_epochs, max_steps): with merge="fill" they
    fill what the config leaves out; with merge="strict" (GigaTrain's build_scheduler) a name given
    twice is an error. A torch LRScheduler gets only those of them it accepts."""
    extra = dict(extra or {})
    if isinstance(cls, type) and issubclass(cls, LRScheduler):
        if optimizer is None:
            raise RegistryError(f"scheduler '{cls.__name__}' is a torch LRScheduler and needs the optimizer")
        params = inspect.signature(cls).parameters
        extra = {k: v for k, v in extra.items() if k in params}
        return cls(optimizer, *args, **_merged(kwargs, extra, merge))
    scheduler = cls(*args, **_merged(kwargs, extra, merge))
    if optimizer is None:
        return scheduler
    if not callable(getattr(scheduler, "get_value", None)):
        raise RegistryError(f"scheduler '{getattr(cls, '__name__', cls)}' has no get_value(step) to wrap in LambdaLR")
    return LambdaLR(optimizer, lr_lambda=scheduler.get_value)


def _merged(kwargs, extra, merge):
    if merge == "strict":
        return merge_params(kwargs, **extra)
    return {**extra, **kwargs}


def build_scheduler(params_or_type, optimizer, *args, **kwargs) -> LambdaLR:
    """GigaTrain's call form: `build_scheduler(cfg_or_type, optimizer, epoch_size=..., max_epochs=...,
    max_steps=...)` -> LambdaLR over the value scheduler (None when no type is named)."""
    params = merge_params(params_or_type, **kwargs)
    obj_type = pop_type(params)
    if obj_type is None:
        return None
    return wrap_scheduler(SCHEDULERS.get(obj_type), params, optimizer, args, merge="strict")


__all__ = ["SCHEDULERS", "build_scheduler", "build_module"]
