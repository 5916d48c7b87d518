"""The training data stream: endless micro-batches across epochs, with an exact, resumable position."""
import hashlib
import inspect
import logging
import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from ..errors import ConfigError
from ..registry import DATASETS, SAMPLERS, TRANSFORMS, import_object
from .device import to_device
from .samplers import DefaultSampler
from .streaming import StreamingData

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


def _accepted(cls, extras):
    params = inspect.signature(cls).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return extras
    return {k: v for k, v in extras.items() if k in params}


def build_dataset(data_or_config):
    if isinstance(data_or_config, dict):
        return DATASETS.build(data_or_config)
    return data_or_config


class DataStream:
    """Micro-batches on the device. Position = (epoch, batches consumed in that epoch)."""

    def __init__(self, cfg, seed, rank, world_size, device, accumulation=1, dataset=None):
        """`seed` seeds the workers' sample RNGs; the sampler has its own (`sampler.seed`, GigaTrain's
        6666 by default), and is given GigaTrain's `batch_size`: the global batch of one optimizer step
        (batch_size_per_gpu * world_size * accumulation), which DefaultSampler pads each epoch to."""
        self.dataset = dataset if dataset is not None else build_dataset(cfg.data_or_config)
        if len(self.dataset) == 0:
            raise ConfigError("dataloaders.train.data_or_config: the dataset is empty (0 samples)")
        global_batch = cfg.batch_size_per_gpu * world_size * accumulation
        # A global batch above the dataset is padded with repeats (GigaTrain's DefaultSampler); one 100x
        # above it is a typo, whose padded epoch would not fit in memory.
        if global_batch > 100 * len(self.dataset):
            raise ConfigError(f"dataloaders.train.batch_size_per_gpu: a global batch of {global_batch} samples"
                              f" ({cfg.batch_size_per_gpu} x {world_size} ranks x {accumulation} accumulation) is"
                              f" over 100 times the dataset ({len(self.dataset)} samples)")
        transform = TRANSFORMS.build(cfg.transform) if cfg.transform else None
        sampler_cfg = dict(cfg.sampler or dict(type="DefaultSampler"))
        cls, kwargs = SAMPLERS.resolve(sampler_cfg)
        extras = dict(dataset=self.dataset, batch_size=cfg.batch_size_per_gpu * world_size * accumulation,
                      batch_size_per_gpu=cfg.batch_size_per_gpu, rank=rank, world_size=world_size)
        kwargs = {**_accepted(cls, extras), **kwargs}
        self.sampler = cls(**kwargs)
        if isinstance(self.sampler, DefaultSampler):
            self.sampler.infinite = False  # this stream moves from epoch to epoch itself
        self.seed, self.device = seed, device
        self.batch_size, self.world_size = cfg.batch_size_per_gpu, world_size
        self._tagged = _EpochTagged(self.sampler)
        pin = cfg.pin_memory if cfg.pin_memory is not None else device.type == "cuda"
        collate = import_object(cfg.collate_fn) if cfg.collate_fn else None
        extra = {}
        if cfg.num_workers > 0:
            extra = dict(persistent_workers=cfg.persistent_workers, prefetch_factor=cfg.prefetch_factor)
        self.loader = DataLoader(_Samples(self.dataset, transform, seed), batch_size=cfg.batch_size_per_gpu,
                                 sampler=self._tagged, num_workers=cfg.num_workers, pin_memory=pin,
                                 collate_fn=collate, drop_last=False, **extra)
        self.epoch, self.batch_in_epoch = 0, 0
        self.samples_seen = 0  # global samples consumed since the start of training
        self._iter = None
        self._ahead = None  # on CUDA one batch is copied ahead, overlapping the copy with the step

    def __len__(self):
        """Batches per epoch."""
        return len(self.loader) if not isinstance(self.sampler, DefaultSampler) else self.sampler.num_batches

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
        self._iter, self._ahead = None, None

    def _start_epoch(self):
        skip = self.batch_in_epoch
        self._tagged.epoch = self.epoch
        if isinstance(self.sampler, DefaultSampler):
            self.sampler.set_epoch(self.epoch, start_sample=skip * self.batch_size * self.world_size)
            skip = 0
        elif hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)
        # A generator of our own: creating an iterator must not draw from the global RNG (exact resume).
        self.loader.generator = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
        self._iter = iter(self.loader)
        for _ in range(skip):  # a sampler we cannot position: replay it (exact, if it is deterministic)
            next(self._iter)

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


def build_stream(cfg, seed, rank, world_size, device, accumulation=1):
    """The training stream of a dataloader section: DataStream for a map-style dataset, StreamingData for an
    IterableDataset (streaming.py)."""
    dataset = build_dataset(cfg.data_or_config)
    if isinstance(dataset, IterableDataset):
        return StreamingData(dataset, cfg, seed, rank, world_size, device)
    return DataStream(cfg, seed, rank, world_size, device, accumulation=accumulation, dataset=dataset)


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
