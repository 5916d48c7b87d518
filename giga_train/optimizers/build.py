"""OPTIMIZERS: torch's own optimizers by name (GigaTrain's list and more), plus ours (CAME8Bit and
FusedAdam register themselves). build_optimizer in GigaTrain's call form."""
import torch

from ..registry import OPTIMIZERS, build_module

for _name in ("AdamW", "Adam", "SGD", "Adadelta", "Adagrad", "Adamax", "ASGD", "LBFGS", "NAdam", "RAdam",
              "RMSprop", "Rprop", "SparseAdam", "Adafactor"):
    if hasattr(torch.optim, _name):
        OPTIMIZERS.register(getattr(torch.optim, _name))


def build_optimizer(params_or_type, *args, **kwargs) -> torch.optim.Optimizer:
    """`build_optimizer(cfg_or_type, params)` or `build_optimizer(cfg, params=params)`: the optimizer
    the config names (`type` or `_class_name`, a registered name or a dotted path); None without one."""
    return build_module(OPTIMIZERS, params_or_type, *args, **kwargs)
