"""Activation checkpointing by class name: "Block" = every Block, "Block__##__4" = the first 4. Selective: the
blocks keep their matmul, convolution and attention outputs and recompute only the cheap ops between them
(torch.utils.checkpoint's create_selective_checkpoint_contexts)."""
import functools

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from .block_classes import parse_class_names, require_classes


def apply_activation_checkpointing(model, names, selective=False):
    """Recompute the matched modules' activations in backward (with `selective`, only those of the ops that are
    not matmuls, convolutions or attention). Returns the number of modules wrapped.

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
            _checkpoint_forward(module, selective)
            wrapped += 1
    return wrapped


def _saved_ops():
    names = ("mm", "addmm", "bmm", "baddbmm", "convolution", "_scaled_mm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_flash_attention_for_cpu")
    return {getattr(torch.ops.aten, n).default for n in names if hasattr(torch.ops.aten, n)}


def _save_matmuls(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in SELECTIVE_SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


SELECTIVE_SAVED_OPS = _saved_ops()  # what "selective" keeps of a block (memory_counts counts them too)


def checkpointed_call(forward, selective=False):
    """`forward` recomputed in backward (non-reentrant torch checkpoint; `selective`: keeping the matmul,
    convolution and attention outputs), as each checkpointed block runs."""
    context = {"context_fn": functools.partial(create_selective_checkpoint_contexts, _save_matmuls)} \
        if selective else {}

    def checkpointed_forward(*args, **kwargs):
        if torch.is_grad_enabled():
            return checkpoint(forward, *args, use_reentrant=False, **context, **kwargs)
        return forward(*args, **kwargs)

    return checkpointed_forward


def _checkpoint_forward(module, selective=False):
    module.forward = checkpointed_call(module.forward, selective)


CHECKPOINTING_VALUES = (False, True, "auto", "selective")
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
