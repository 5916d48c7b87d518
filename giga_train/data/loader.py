"""The training data stream: endless micro-batches across epochs, with an exact, resumable position."""
import hashlib
import inspect
import logging
import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from ..errors import ConfigError
from ..registry import SAMPLERS, TRANSFORMS
from .device import to_device
from ..compat.giga_datasets import load_dataset, open_dataset
from .hf_datasets import as_streaming
from .samplers import DefaultSampler, EpochPlan
from .streaming import StreamingData, is_streaming

log = logging.getLogger("giga_train")


class _Samples(Dataset):
    """dataset[index] then transform, keyed by (epoch, index).

    In a worker process the RNGs are seeded from (seed, epoch, index) first, so random transforms
    give the same sample whichever worker draws it, and a resumed run sees what an uninterrupted one
    saw. In the main process the global RNG (saved in checkpoints) plays that role."""

    def __init__(self, dataset, transform, seed):
        self.dataset, self.transform, self.seed = dataset, transform, seed

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key):
        epoch, index = key
        if get_worker_info() is not None:
            digest = hashlib.blake2b(f"{self.seed}/{epoch}/{index}".encode(), digest_size=8).digest()
            sample_seed = int.from_bytes(digest, "little") & (2**63 - 1)
            torch.manual_seed(sample_seed)
            random.seed(sample_seed)
            np.random.seed(sample_seed % 2**32)
        sample = self.dataset[index]
        return self.transform(sample) if self.transform is not None else sample


class _EpochTagged(torch.utils.data.Sampler):
    def __init__(self, sampler):
        self.sampler, self.epoch = sampler, 0

    def __iter__(self):
        return ((self.epoch, i) for i in self.sampler)

    def __len__(self):
        return len(self.sampler)


class _EpochPlanBatches(torch.utils.data.Sampler):
    """An EpochPlan's batches from `start` on, each index keyed by the epoch (for _Samples)."""

    def __init__(self, plan):
        self.plan, self.epoch, self.start = plan, 0, 0

    def __iter__(self):
        batches = self.plan.batches(self.epoch)
        return ([(self.epoch, i) for i in batches[k]] for k in range(self.start, len(batches)))

    def __len__(self):
        return len(self.plan.batches(self.epoch)) - self.start


def _accepted(cls, extras):
    params = inspect.signature(cls).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return extras
    return {k: v for k, v in extras.items() if k in params}


def build_dataset(data_or_config, where="data_or_config"):
    """GigaTrain's data_or_config (a folder, a config dict, a list of them) or a Dataset, opened."""
    return load_dataset(data_or_config, where)[0]


class DataStream:
    """Micro-batches on the device. Position = (epoch, batches consumed in that epoch)."""

    def __init__(self, cfg, seed, rank, world_size, device, accumulation=1, data_parallel_size=1):
        """`seed` seeds the workers' sample RNGs; the sampler has its own (`sampler.seed`, GigaTrain's
        6666 by default), and is given GigaTrain's `batch_size`: the global batch of one optimizer step
        (batch_size_per_gpu * world_size * accumulation), which DefaultSampler pads each epoch to.
        Our DefaultSampler is positioned directly; any other sampler, a `batch_sampler`, and
        `data_parallel_size` > 1 go through an EpochPlan (resumed by skipping consumed batches)."""
        transform = TRANSFORMS.build(cfg.transform) if cfg.transform else None
        self.dataset, transform, collate = open_dataset(cfg, transform, "dataloaders.train")
        if len(self.dataset) == 0:
            raise ConfigError("dataloaders.train.data_or_config: the dataset is empty (0 samples)")
        global_batch = cfg.batch_size_per_gpu * world_size * accumulation
        # A global batch above the dataset is padded with repeats (GigaTrain's DefaultSampler); one 100x
        # above it is a typo, whose padded epoch would not fit in memory.
        if global_batch > 100 * len(self.dataset):
            raise ConfigError(f"dataloaders.train.batch_size_per_gpu: a global batch of {global_batch} samples"
                              f" ({cfg.batch_size_per_gpu} x {world_size} ranks x {accumulation} accumulation) is"
                              f" over 100 times the dataset ({len(self.dataset)} samples)")
        if global_batch > len(self.dataset):
            log.warning("dataloaders.train.batch_size_per_gpu: a global batch of %d samples (%d x %d ranks x %d"
                        " accumulation) is larger than the dataset (%d samples): each step repeats samples",
                        global_batch, cfg.batch_size_per_gpu, world_size, accumulation, len(self.dataset))
        yields_batches = cfg.get("batch_sampler") is not None
        cls, kwargs = SAMPLERS.resolve(dict(cfg.batch_sampler if yields_batches else
                                            cfg.sampler or dict(type="DefaultSampler")))
        extras = dict(dataset=self.dataset, batch_size=global_batch, batch_size_per_gpu=cfg.batch_size_per_gpu,
                      rank=rank, world_size=world_size)
        accepted = _accepted(cls, extras)
        ours = isinstance(cls, type) and issubclass(cls, DefaultSampler)
        positioned = ours and not yields_batches and data_parallel_size == 1
        if ours and not positioned:
            accepted.update(rank=0, world_size=1)  # the whole order: the plan deals it to the ranks
        self.sampler = cls(**{**accepted, **kwargs})
        self.plan = None
        if positioned:
            self.sampler.infinite = False  # this stream moves from epoch to epoch itself
            self._tagged = _EpochTagged(self.sampler)
            batching = dict(sampler=self._tagged, batch_size=cfg.batch_size_per_gpu, drop_last=False)
        else:
            self.plan = EpochPlan(self.sampler, cfg.batch_size_per_gpu, self._plan_seed(seed), rank, world_size,
                                  yields_batches, data_parallel_size,
                                  self_sharded=not ours and bool({"rank", "world_size"} & set(accepted)))
            self._tagged = _EpochPlanBatches(self.plan)
            batching = dict(batch_sampler=self._tagged)
        self.seed, self.device = seed, device
        self.batch_size, self.world_size = cfg.batch_size_per_gpu, world_size
        pin = cfg.pin_memory if cfg.pin_memory is not None else device.type == "cuda"
        extra = {}
        if cfg.num_workers > 0:
            extra = dict(persistent_workers=cfg.persistent_workers, prefetch_factor=cfg.prefetch_factor)
        self.loader = DataLoader(_Samples(self.dataset, transform, seed), num_workers=cfg.num_workers,
                                 pin_memory=pin, collate_fn=collate, **batching, **extra)
        self.epoch, self.batch_in_epoch = 0, 0
        self.samples_seen = 0  # global samples consumed since the start of training
        self._iter = None
        self._ahead = None  # on CUDA one batch is copied ahead, overlapping the copy with the step

    def __len__(self):
        """Batches per epoch."""
        return self.sampler.num_batches if self.plan is None else len(self.plan.batches(self.epoch))

    def _plan_seed(self, seed):
        """What seeds an EpochPlan's RNGs: the sampler's own seed where it has one (as GigaTrain's order
        depends on it only), else the run's."""
        own = getattr(self.sampler, "seed", None)
        return own if isinstance(own, int) else seed

    @property
    def global_batch(self):
        return self.batch_size * self.world_size

    def state_dict(self):
        return dict(epoch=self.epoch, batch_in_epoch=self.batch_in_epoch, samples_seen=self.samples_seen,
                    global_batch=self.global_batch)

    def load_state_dict(self, state):
        """Continue where `state` stopped, also when it was saved with another global batch (world size
        or batch_size_per_gpu changed): the position is then the samples seen in the epoch, rounded
        down to a whole global batch of ours (said in one line when that repeats samples)."""
        self.epoch, self.batch_in_epoch = int(state["epoch"]), int(state["batch_in_epoch"])
        self.samples_seen = int(state.get("samples_seen", self.samples_seen))
        saved_batch = int(state.get("global_batch", self.global_batch))
        if saved_batch != self.global_batch:
            in_epoch = self.batch_in_epoch * saved_batch
            self.batch_in_epoch = in_epoch // self.global_batch
            again = in_epoch - self.batch_in_epoch * self.global_batch
            self.samples_seen -= again
            if again:
                log.warning("resume: global batch %d -> %d; epoch %d continues at sample %d, not %d "
                            "(%d samples seen again)", saved_batch, self.global_batch, self.epoch,
                            in_epoch - again, in_epoch, again)
        if self.batch_in_epoch >= len(self):  # the dataset shrank below the saved position
            log.warning("resume: the dataset has %d batches an epoch now, and epoch %d was saved at batch %d"
                        " (it is smaller than when saved); epoch %d starts", len(self), self.epoch,
                        self.batch_in_epoch, self.epoch + 1)
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
        if self.plan is not None and self.batch_in_epoch:
            log.info("resume: %s cannot say where it is; epoch %d's order is drawn again and its first %d batches"
                     " skipped (their indices only, as GigaTrain skips consumed batches)",
                     type(self.sampler).__name__, self.epoch, self.batch_in_epoch)
        self._iter, self._ahead = None, None

    def _start_epoch(self):
        self._tagged.epoch = self.epoch
        if self.plan is None:
            self.sampler.set_epoch(self.epoch, start_sample=self.batch_in_epoch * self.batch_size * self.world_size)
        else:
            self._tagged.start = self.batch_in_epoch
        # A generator of our own: creating an iterator must not draw from the global RNG (exact resume).
        self.loader.generator = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
        if self.epoch == 0 and self.batch_in_epoch == 0 and self.samples_seen == 0:
            draw_like_gigatrains_iterator()
        self._iter = iter(self.loader)

    def _next_raw(self):
        if self._iter is None:
            self._start_epoch()
        try:
            return next(self._iter)
        except StopIteration:
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            self._start_epoch()
            return next(self._iter)

    def __iter__(self):
        return self

    def __next__(self):
        if self.device.type != "cuda":
            batch = self._next_raw()
        else:
            batch = self._ahead if self._ahead is not None else to_device(self._next_raw(), self.device)
            self._ahead = None
        self.batch_in_epoch += 1
        self.samples_seen += self.global_batch
        if self.batch_in_epoch == len(self):
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            self._iter = None
        elif self.device.type == "cuda":
            self._ahead = to_device(self._next_raw(), self.device)
        return batch


def draw_like_gigatrains_iterator():
    """The one draw GigaTrain's loader makes from the global torch RNG: torch's _BaseDataLoaderIter takes an
    int64 base seed from it when GigaTrain's train() creates its one iterator (giga_datasets' samplers are
    endless: no iterator is created again), before the first batch. Made once, when the stream starts at its
    first sample: a resume restores the RNG state saved after it, so the resumed stream is the uninterrupted
    one. With it, forward_step's torch.randn draws GigaTrain's noise from the same seed."""
    torch.empty((), dtype=torch.int64).random_()


def build_stream(cfg, seed, rank, world_size, device, accumulation=1, data_parallel_size=1):
    """The training stream of a dataloader section: DataStream for a map-style dataset, StreamingData for an
    IterableDataset (streaming.py)."""
    if cfg.get("data_or_config") is None:
        raise ConfigError("dataloaders.train.data_or_config: required (the training data), unless get_dataloaders"
                          " returns the data itself (a Dataset or a DataLoader)")
    if is_streaming(cfg.data_or_config):
        return StreamingData(as_streaming(build_dataset(cfg.data_or_config)), cfg, seed, rank, world_size, device)
    return DataStream(cfg, seed, rank, world_size, device, accumulation=accumulation,
                      data_parallel_size=data_parallel_size)


class LoaderStream:
    """Any iterable loader (a get_dataloaders override returning a torch DataLoader) as an endless stream
    of micro-batches on the device. Position = (epoch, batches consumed in it). Such a loader cannot say
    where it is, so a resume replays its epoch up to there (GigaTrain's skip of the consumed batches):
    exact when its order depends only on the epoch (a sampler with set_epoch, or none shuffled)."""

    def __init__(self, loader, device):
        self.loader, self.device = loader, device
        self.epoch, self.batch_in_epoch = 0, 0
        self._iter = None

    def __len__(self):
        return len(self.loader)

    def state_dict(self):
        return dict(epoch=self.epoch, batch_in_epoch=self.batch_in_epoch)

    def load_state_dict(self, state):
        self.epoch, self.batch_in_epoch = int(state["epoch"]), int(state["batch_in_epoch"])
        self._iter = None
        if self.batch_in_epoch:
            log.info("resume: the data loader cannot be positioned; replaying %d batches of epoch %d",
                     self.batch_in_epoch, self.epoch)

    def __iter__(self):
        return self

    def __next__(self):
        if self._iter is None:
            samplers = (getattr(self.loader, "sampler", None), getattr(self.loader, "batch_sampler", None))
            for holder in (self.loader, *samplers):
                if hasattr(holder, "set_epoch"):
                    holder.set_epoch(self.epoch)
            self._iter = iter(self.loader)
            for _ in range(self.batch_in_epoch):
                next(self._iter)
        try:
            batch = next(self._iter)
        except StopIteration:
            self.epoch, self.batch_in_epoch, self._iter = self.epoch + 1, 0, None
            return next(self)
        self.batch_in_epoch += 1
        return to_device(batch, self.device)


def as_stream(loader, device):
    """The stream the training loop reads: our DataStream as it is, any other loader through LoaderStream."""
    return loader if isinstance(loader, (DataStream, StreamingData)) else LoaderStream(loader, device)
