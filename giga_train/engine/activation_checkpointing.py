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


def checkpointed_inner_forward(module):
    """The forward that apply_activation_checkpointing wrapped on `module`, or None where it wrapped none."""
    return getattr(module.forward, "checkpointed_forward", None)


def replace_inner_forward(module, inner):
    """Keep `module` checkpointed around `inner` instead (compile puts a compiled forward inside)."""
    module.forward = _checkpointing(inner)


def _checkpoint_forward(module):
    module.forward = _checkpointing(module.forward)


def _checkpointing(forward):

    def checkpointed_forward(*args, **kwargs):
        if torch.is_grad_enabled():
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return forward(*args, **kwargs)

    checkpointed_forward.checkpointed_forward = forward
    return checkpointed_forward
