"""Activation checkpointing by class name: "Block" = every Block, "Block__##__4" = the first 4."""
import torch
from torch.utils.checkpoint import checkpoint

from .block_classes import parse_class_names, require_classes


def apply_activation_checkpointing(model, names):
    """Recompute the matched modules' activations in backward. Returns the number of modules wrapped.

    The module's own forward is swapped (not the module tree), so parameter names, state dicts and
    the sharding wrappers applied afterwards are unchanged."""
    limits = parse_class_names(names)
    require_classes(model, limits, "train.activation_class_names")
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


CHECKPOINTING_VALUES = (False, True, "auto")
BUDGET_UNITS = (("gib", 2**30), ("gb", 1e9), ("mib", 2**20), ("mb", 1e6), ("kib", 2**10))


def memory_budget_bytes(value, total):
    """train.checkpointing_memory_budget in bytes: a fraction (0, 1] of `total` (the device's memory) or a
    size such as '60GiB', '500MiB'. Raises ValueError with the problem (the schema's one line)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if 0 < value <= 1:
            return int(value * total) if total is not None else None
        raise ValueError(f"{value!r} is neither a fraction of the device's memory in (0, 1] nor a size like '60GiB'")
    text = str(value).strip().lower()
    for unit, scale in BUDGET_UNITS:
        if text.endswith(unit):
            try:
                size = float(text[:-len(unit)])
            except ValueError:
                break
            if size > 0:
                return int(size * scale)
    raise ValueError(f"{value!r} is neither a fraction of the device's memory in (0, 1] nor a size like '60GiB'")
