"""train.count_flops: the model FLOPs of one sample, counted once at start from the model and the sample shape:
the config's get_models built on fake tensors (no memory; no compile, no activation checkpointing, so neither
the compiled kernels nor the recomputation hide or add FLOPs), one forward_step and the backward of its loss
under torch.utils.flop_counter, with SDPA's math backend so that attention is counted as its two S x S
matmuls on any device (the counter misses CPU flash attention). A forward_step that cannot run on fake tensors
falls back to counting the run's first step (tracking/perf.py)."""
import contextlib
import logging

import torch

from ..data import as_stream
from ..engine.precision import AUTOCAST_DTYPES
from .offline_copy import build, offline_copy

log = logging.getLogger("giga_train")


def count_flops_per_sample(trainer, samples_per_micro_batch):
    """FLOPs of forward + backward of one sample (a micro-batch's / its samples on this rank)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    from .train_data import train_loaders
    shadow = offline_copy(trainer, "cpu")
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    build(shadow, fake)
    batch = next(iter(as_stream(train_loaders(shadow, shadow.config.dataloaders.train)[0], torch.device("cpu"))))
    dtype = AUTOCAST_DTYPES.get(shadow.mixed_precision or "no")
    autocast = torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()
    counter = FlopCounterMode(display=False)
    with fake, counter, sdpa_kernel(SDPBackend.MATH):
        with autocast:
            losses = shadow.forward_step(batch)
        values = losses.values() if isinstance(losses, dict) else [losses]
        sum(v.float().mean() for v in values).backward()
    return counter.get_total_flops() / samples_per_micro_batch


def model_flops_per_sample(trainer):
    """count_flops_per_sample for the live trainer, or None (logged) where its hooks cannot run on fake
    tensors; None without train.count_flops."""
    if not trainer.train_config.get("count_flops"):
        return None
    # the samples one data rank's micro-batch holds (sequence-parallel ranks share theirs)
    data_ranks = getattr(trainer, "data_rank_and_world", (0, trainer.num_processes))[1]
    per_micro_batch = trainer.batch_size / (data_ranks * trainer.gradient_accumulation_steps)
    try:
        flops = count_flops_per_sample(trainer, per_micro_batch)
    except Exception as e:
        first = str(e).splitlines()[0][:160] if str(e) else ""
        trainer.print("count_flops: the model could not be counted on fake tensors (%s: %s); counting the first"
                      " step instead", type(e).__name__, first)
        return None
    trainer.print("count_flops: %.4g GFLOP per sample (forward + backward, attention included)", flops / 1e9)
    return flops
