"""Samplers: DefaultSampler (GigaTrain's order, cut per rank, resumable), ParallelBatchSampler, build_sampler,
and EpochPlan (any other sampler or batch sampler, made resumable)."""
import contextlib
import itertools
import math
import random
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from ..registry import SAMPLERS, build_module
from ..compat.giga_datasets import register_samplers


@SAMPLERS.register
class DefaultSampler(Sampler):
    """GigaTrain's DefaultSampler (giga_datasets): the same indices in the same order for the same seed.

    Epoch e is a permutation of the data drawn by NumPy's legacy generator seeded with `seed + e`
    (`arange` without shuffle), padded up to a multiple of `batch_size` with the start of further
    permutations from that generator, so samples repeat within an epoch as with torch's
    DistributedSampler. `batch_size` is the padding unit: GigaTrain passes the global batch
    (batch_size_per_gpu * processes * gradient_accumulation_steps). `infinite`: run into the next
    epoch after one ends (each pass advances `epoch`), as GigaTrain does; False: one epoch per pass.

    Ours on top (with the defaults it is GigaTrain's sampler):
    - rank / world_size / batch_size_per_gpu: each rank yields its share of the order, laid out as
      GigaTrain's ranks get it from Accelerate (the BatchSampler's batches of batch_size_per_gpu dealt
      round-robin to the ranks): micro-batch m of rank r holds order[(m*W + r)*B : (m*W + r + 1)*B].
      One process with a batch of B*W sees the union of W ranks' batches, step for step.
    - set_epoch(epoch, start_sample): start that epoch after `start_sample` global samples (resume).
    - drop_last: cut the epoch down to whole multiples of `batch_size` instead of padding.
    The order is drawn from a generator of its own: NumPy's global RNG is left untouched.
    """

    def __init__(self, dataset, batch_size=None, shuffle=True, infinite=True, seed=6666, rank=0, world_size=1,
                 batch_size_per_gpu=None, drop_last=False):
        self.data_size = len(dataset)
        if self.data_size == 0:
            raise ValueError("the dataset is empty")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        self.shuffle, self.infinite, self.seed = shuffle, infinite, seed
        self.rank, self.world_size, self.drop_last = rank, world_size, drop_last
        self.batch_size = batch_size
        unit = batch_size or 1
        per_rank = batch_size_per_gpu or max(unit // world_size, 1)
        self.batch_size_per_gpu = per_rank
        if drop_last:
            self.total_size = self.data_size // unit * unit
            if self.total_size == 0:
                raise ValueError(f"drop_last with batch_size {unit} leaves nothing of {self.data_size} samples")
        else:
            self.total_size = int(math.ceil(self.data_size / unit)) * unit
        if world_size > 1 and self.total_size % (per_rank * world_size):
            raise ValueError(f"batch_size {batch_size} is not a multiple of batch_size_per_gpu {per_rank} x "
                             f"world_size {world_size}")
        self.epoch = 0
        self.start_sample = 0  # global samples of this epoch already consumed

    @property
    def global_batch(self):
        """Samples one micro-step takes from the order, all ranks together."""
        return self.batch_size_per_gpu * self.world_size

    @property
    def num_batches(self):
        """Micro-batches of each rank in one epoch."""
        return int(math.ceil(self.total_size / self.global_batch))

    def set_epoch(self, epoch, start_sample=0):
        self.epoch, self.start_sample = epoch, start_sample

    def epoch_order(self, epoch):
        """The whole order of `epoch` (all ranks), as GigaTrain's sampler yields it."""
        rng = np.random.RandomState(self.seed + epoch)  # what np.random.seed(seed + epoch) sets up
        parts, count = [], 0
        while count < self.total_size:
            part = rng.permutation(self.data_size) if self.shuffle else np.arange(self.data_size)
            part = part[:self.total_size - count]
            parts.append(part)
            count += len(part)
        return np.concatenate(parts).astype(np.int64)

    def _rank_order(self):
        order = self.epoch_order(self.epoch)
        first = self.start_sample // self.global_batch * self.global_batch
        if self.world_size == 1:
            return order[first:]
        order = order.reshape(-1, self.world_size, self.batch_size_per_gpu)
        return order[first // self.global_batch:, self.rank].reshape(-1)

    def __iter__(self):
        while True:
            order = self._rank_order()
            self.epoch, self.start_sample = self.epoch + 1, 0
            yield from order.tolist()
            if not self.infinite:
                return

    def __len__(self):
        """Indices of one pass of this rank (the rest of the epoch after a set_epoch(start_sample))."""
        if self.world_size == 1:
            return self.total_size - self.start_sample // self.global_batch * self.global_batch
        return (self.num_batches - self.start_sample // self.global_batch) * self.batch_size_per_gpu


@SAMPLERS.register
class ParallelBatchSampler(Sampler):
    """GigaTrain's: each batch of `batch_sampler` yielded `data_parallel_size` times in a row, for
    model replicas inside one process."""

    def __init__(self, batch_sampler, data_parallel_size):
        self.batch_sampler = batch_sampler
        self.data_parallel_size = data_parallel_size
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = getattr(batch_sampler, "drop_last", False)

    def set_epoch(self, epoch):
        if hasattr(self.batch_sampler, "set_epoch"):
            self.batch_sampler.set_epoch(epoch)

    def __len__(self):
        return len(self.batch_sampler) * self.data_parallel_size

    def __iter__(self):
        for batch in self.batch_sampler:
            for _ in range(self.data_parallel_size):
                yield batch


class EpochPlan:
    """This rank's micro-batches of one epoch of a sampler that cannot say where it is (giga_datasets'
    bucket and aspect-ratio samplers, a batch_sampler, a user's sampler): the epoch is drawn whole, as
    index lists, cut into per-GPU batches (a sampler) or taken as they come (a batch sampler, whose
    batches may differ in size), each repeated `repeat` times (GigaTrain's data_parallel_size), then
    dealt round-robin to the ranks as Accelerate deals GigaTrain's batches (every rank gets as many:
    the last ones are filled from the epoch's start). `self_sharded`: the sampler cut itself per rank.

    A resume draws the epoch again and skips the batches consumed (GigaTrain's skip, on indices only:
    no sample is loaded for them). It is exact because drawing runs with Python's, NumPy's and torch's
    global RNGs seeded from (seed, epoch) and restored afterwards: giga_datasets' samplers reseed
    NumPy's and BucketBatchSampler shuffles with Python's `random`, so the order is the same on every
    rank, in a resumed run, and the caller's RNG streams are left as they were."""

    def __init__(self, source, batch_size_per_gpu, seed, rank=0, world_size=1, yields_batches=False, repeat=1,
                 self_sharded=False):
        self.source, self.batch_size_per_gpu, self.seed = source, batch_size_per_gpu, seed
        self.rank, self.world_size, self.repeat = rank, world_size, repeat
        self.yields_batches, self.self_sharded = yields_batches, self_sharded
        self._cached = (None, None)

    def batches(self, epoch):
        if self._cached[0] != epoch:
            self._cached = (epoch, self._draw(epoch))
        return self._cached[1]

    def _draw(self, epoch):
        """This rank's batches, held as one index array and each batch's bounds (a list of Python ints per
        sample would take ~36 bytes each: gigabytes per rank for a large dataset)."""
        with _seeded_rngs(self.seed * 100003 + epoch):
            if hasattr(self.source, "set_epoch"):
                self.source.set_epoch(epoch)
            drawn = itertools.islice(iter(self.source), len(self.source))  # one pass of an infinite one
            if self.yields_batches:
                lengths, flat = [], []
                for batch in drawn:
                    lengths.append(len(batch))
                    flat.extend(int(i) for i in batch)
                flat = np.asarray(flat, dtype=np.int64)
                ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
                starts = ends - lengths
            else:
                flat = np.fromiter((int(i) for i in drawn), dtype=np.int64)
                starts = np.arange(0, len(flat), self.batch_size_per_gpu, dtype=np.int64)
                ends = np.minimum(starts + self.batch_size_per_gpu, len(flat))
        if not len(starts):
            raise ValueError(f"{type(self.source).__name__} yields no batch for epoch {epoch}")
        starts, ends = np.repeat(starts, self.repeat), np.repeat(ends, self.repeat)
        if not (self.self_sharded or self.world_size == 1):
            dealt = np.arange(len(starts) + -len(starts) % self.world_size) % len(starts)
            dealt = dealt[self.rank::self.world_size]
            starts, ends = starts[dealt], ends[dealt]
        return _Batches(flat, starts, ends)


class _Batches:
    """batch k = flat[starts[k]:ends[k]], as a list of ints."""

    def __init__(self, flat, starts, ends):
        self.flat, self.starts, self.ends = flat, starts, ends

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, k):
        return self.flat[self.starts[k]:self.ends[k]].tolist()


@contextlib.contextmanager
def _seeded_rngs(seed):
    python, numpy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(python)
            np.random.set_state(numpy)


SAMPLERS.add_provider(register_samplers)  # giga_datasets' samplers, looked up at the first unknown name


def build_sampler(params_or_type, *args, **kwargs) -> Any:
    """GigaTrain's call form: `build_sampler(cfg_or_type, dataset=..., batch_size=...)`; None without a type."""
    return build_module(SAMPLERS, params_or_type, *args, **kwargs)


__all__ = ["DefaultSampler", "EpochPlan", "ParallelBatchSampler", "build_sampler"]
