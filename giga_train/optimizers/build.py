"""OPTIMIZERS: torch's own optimizers by name, plus ours (CAME8Bit, FusedAdam register themselves)."""
import torch

from ..registry import OPTIMIZERS

for _name in ("AdamW", "Adam", "SGD", "Adagrad", "Adamax", "NAdam", "RAdam", "RMSprop", "Adafactor"):
    if hasattr(torch.optim, _name):
        OPTIMIZERS.register(getattr(torch.optim, _name))


def build_optimizer(cfg, params):
    return OPTIMIZERS.build(cfg, params)
