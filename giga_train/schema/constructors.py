"""What an optimizer or scheduler would refuse for its values, found at check time: each optimizer and
scheduler the config names is built once on a stand-in parameter (2x2 zeros, nothing trained), and its
ValueError becomes the one line that names the section. Non-finite numbers are refused before that:
an inf lr or eps is accepted by torch's constructors and trains to NaN."""
import math

import torch
from torch.optim.lr_scheduler import LRScheduler

from ..errors import ConfigError, RegistryError
from ..registry import OPTIMIZERS
from ..schedulers import SCHEDULERS


def refuse_non_finite(where, value):
    """ConfigError naming the first key under `where` holding inf or nan (in lists too)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: {value} is not a value this key can take (give a finite number)")
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        refuse_non_finite(f"{where}.{key}" if isinstance(value, dict) else f"{where}[{key}]", item)


def stand_in_optimizer(where, cfg):
    """The optimizer `cfg` names, built over one 2x2 zero parameter: its constructor's checks, and the
    optimizer a scheduler is tried on. ConfigError for a value it refuses."""
    refuse_non_finite(where, cfg)
    cls, kwargs = OPTIMIZERS.resolve(cfg)
    try:
        return cls([torch.zeros(2, 2, requires_grad=True)], **kwargs)
    except ValueError as e:  # torch's and ours: "Invalid learning rate: -1", "betas must be ..."
        raise ConfigError(f"{where}: {getattr(cls, '__name__', cls)} refuses its values: {_line(e)}") from None


def try_scheduler(where, cfg, optimizer, train):
    """Build the scheduler `cfg` names (a value scheduler alone; a torch LRScheduler on `optimizer`) with
    the train section's max_steps / max_epochs: ConfigError for a value it refuses."""
    refuse_non_finite(where, cfg)
    cls, _ = SCHEDULERS.resolve(cfg)
    torch_scheduler = isinstance(cls, type) and issubclass(cls, LRScheduler)
    if torch_scheduler and optimizer is None:
        return
    extras = {k: train.get(k) for k in ("max_epochs", "max_steps") if train.get(k)}
    try:
        scheduler = SCHEDULERS.build(cfg, optimizer if torch_scheduler else None, **extras)
    except (ValueError, RegistryError) as e:
        raise ConfigError(f"{where}: {getattr(cls, '__name__', cls)} refuses its values: {_line(e)}") from None
    for key in ("start_value", "end_value"):  # a value scheduler's value multiplies the optimizer's lr
        value = getattr(scheduler, key, None)
        if not torch_scheduler and isinstance(value, (int, float)) and value < 0:
            raise ConfigError(f"{where}.{key}: {value} would make the lr negative (the value multiplies each"
                              " param group's lr): give a value >= 0")


def check_constructors(cfg):
    """Every optimizer and scheduler of the config, built once as described above (after the schema has
    checked their names and argument names)."""
    optimizers = _entries("optimizers", cfg.optimizers)
    built = [stand_in_optimizer(where, entry) for where, entry in optimizers]
    for i, (where, entry) in enumerate(_entries("schedulers", cfg.schedulers)):
        optimizer = built[i] if i < len(built) else built[0] if built else None
        try_scheduler(where, entry, optimizer, cfg.train)


def _entries(section, value):
    if isinstance(value, dict):
        return [(section, value)]
    return [(f"{section}[{i}]", entry) for i, entry in enumerate(value)]


def _line(error):
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
