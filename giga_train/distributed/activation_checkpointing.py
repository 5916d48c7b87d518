"""Activation checkpointing by class name: "Block" = every Block, "Block__##__4" = the first 4."""
import torch
from torch.utils.checkpoint import checkpoint

from ..config import ConfigError


def parse_class_names(names):
    """{"Block": None (all) or N (the first N)}."""
    limits = {}
    for entry in names:
        name, _, count = entry.partition("__##__")
        limits[name] = int(count) if count else None
    return limits


def apply_activation_checkpointing(model, names):
    """Recompute the matched modules' activations in backward. Returns the number of modules wrapped.

    The module's own forward is swapped (not the module tree), so parameter names, state dicts and
    the sharding wrappers applied afterwards are unchanged."""
    limits = parse_class_names(names)
    present = sorted({type(m).__name__ for m in model.modules()})
    missing = [n for n in limits if n not in present]
    if missing:
        raise ConfigError(f"train.activation_class_names: no module of class '{missing[0]}' in the model"
                          f" (classes present: {', '.join(present)})")
    seen = dict.fromkeys(limits, 0)
    wrapped = 0
    for module in model.modules():
        name = type(module).__name__
        if name in limits and (limits[name] is None or seen[name] < limits[name]):
            seen[name] += 1
            _checkpoint_forward(module)
            wrapped += 1
    return wrapped


def _checkpoint_forward(module):
    forward = module.forward

    def checkpointed_forward(*args, **kwargs):
        if torch.is_grad_enabled():
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return forward(*args, **kwargs)

    module.forward = checkpointed_forward
