"""train.activation_checkpointing="auto": checkpoint only as many blocks as the memory budget needs.

The first N blocks in run order are checkpointed ("Class__##__N"), with the smallest N whose peak, counted as
`plan` counts it (memory_counts), fits train.checkpointing_memory_budget (docs/performance.md, "Activation
checkpointing by memory budget")."""
import logging
import os

import torch

from ..engine.activation_checkpointing import memory_budget_bytes
from .memory_counts import count_activations, count_parameters, optimizer_state_bytes
from .offline_copy import build, offline_copy

log = logging.getLogger("giga_train")
FIT_FRACTION = 0.88  # plan's


def device_memory(device):
    """(bytes this process could use now, the device's total): on CUDA what mem_get_info says is free plus
    what torch already holds here; on CPU the available and total physical memory."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device), total
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def peak_bytes(count, n, states, grads, accumulation=1, sp=1):
    """plan's peak with the first `n` blocks checkpointed: the states, then the gradients and activations
    backward holds at once (ActivationCount.backward_peak: the block recomputed beside the gradients made
    so far)."""
    return states + count.backward_peak(n, grads, accumulation, sp)


def choose_blocks(count, states, grads, budget, accumulation=1, sp=1):
    """The smallest number of first blocks to checkpoint whose peak fits `budget` (every block if none fits),
    and the peak it plans."""
    for n in range(count.blocks + 1):
        peak = peak_bytes(count, n, states, grads, accumulation, sp)
        if peak <= budget:
            return n, peak
    return count.blocks, peak_bytes(count, count.blocks, states, grads, accumulation, sp)


def class_limits(count, n):
    """{"Class": how many of the first n blocks (in run order) are of it} for activation_checkpointing.py."""
    limits = {name: 0 for name in count.block_classes}
    for name in count.block_order[:n]:
        limits[name] = limits.get(name, 0) + 1
    return {name: k for name, k in limits.items() if k}


def auto_checkpointing(trainer, model, budget=None):
    """(the class limits to checkpoint, a one-line reason) for `model` under the trainer's config."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    train = trainer.train_config
    cpu = offline_copy(trainer, "cpu")
    count = count_activations(cpu, lambda mode: build(cpu, mode), FakeTensorMode(allow_non_fake_inputs=True))
    meta = offline_copy(trainer, "meta")
    meta_model = build(meta, torch.device("meta"))
    optimizer, _ = optimizer_state_bytes(meta, meta_model)
    params = count_parameters(model)
    states = params.bytes + params.buffer_bytes + optimizer
    available, total = device_memory(trainer.device)
    setting = budget if budget is not None else train.get("checkpointing_memory_budget")
    wanted = memory_budget_bytes(setting, total) if setting is not None else int(FIT_FRACTION * available)
    limit = min(wanted, available)
    accumulation = int(train.gradient_accumulation_steps or 1)
    n, peak = choose_blocks(count, states, params.trainable_bytes, limit, accumulation)
    fits = peak <= limit
    where = (f"train.checkpointing_memory_budget={setting!r}" if setting is not None
             else f"{FIT_FRACTION:.0%} of the free memory") + (", capped by the free memory" if limit < wanted else "")
    reason = (f"activation checkpointing 'auto': {n} of {count.blocks} blocks checkpointed"
              f" ({', '.join(f'{k} x{v}' for k, v in class_limits(count, n).items()) or 'none'}): planned peak"
              f" {_size(peak)} (states {_size(states)}, gradients {_size(params.trainable_bytes)}, activations"
              f" {_size(count.with_first_checkpointed(n))} of {_size(count.saved)} without checkpointing)"
              f" {'within' if fits else 'ABOVE'} the budget {_size(limit)} ({where})"
              + ("; the compiled blocks counted as inductor saves them" if count.compiled else "")
              + (f"; {count.note}" if count.note else ""))
    return class_limits(count, n), reason


def checkpointed_class_names(trainer, model):
    """What activation_checkpointing.py is given for `model`: the configured class names, or under 'auto'
    the first N blocks the budget needs (and one log line saying how many and why)."""
    train = trainer.train_config
    if train.activation_checkpointing != "auto":
        return train.activation_class_names
    try:
        limits, reason = auto_checkpointing(trainer, model)
    except Exception as e:  # a forward_step or get_models that cannot run on fake tensors
        first = str(e).splitlines()[0][:160] if str(e) else ""
        limits = train.activation_class_names
        reason = (f"activation checkpointing 'auto': could not count the activations ({type(e).__name__}: {first});"
                  " every block checkpointed, as activation_checkpointing=True")
    trainer.print(reason)
    return limits


def _size(value):
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.2f} MiB"
