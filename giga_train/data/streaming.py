"""Streaming data: an IterableDataset (no length, no indices) as the endless, resumable stream of micro-batches
the training loop reads, sharded by rank and DataLoader worker.

Each batch carries its worker's position after it, so the position saved (data_state_<rank>.pt) is what the
loop consumed: a stateful dataset resumes exactly, any other replays the epoch's consumed batches
(docs/config.md, "Streaming data")."""
import hashlib
import logging
import random

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info

from ..errors import ConfigError
from ..registry import DATASETS, TRANSFORMS, import_object
from .device import to_device

log = logging.getLogger("giga_train")


def is_stateful(dataset):
    return callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None))


def _seed_sample(seed, epoch, shard, index):
    """As the map-style path: a worker's RNGs are seeded per sample, so random transforms repeat on resume."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{shard}/{index}".encode(), digest_size=8).digest()
    sample_seed = int.from_bytes(digest, "little") & (2**63 - 1)
    torch.manual_seed(sample_seed)
    random.seed(sample_seed)
    np.random.seed(sample_seed % 2**32)


class _ShardBatches(IterableDataset):
    """Runs in each worker (or the main process): this worker's shard of the dataset, transformed and
    collated into batches, each yielded as (batch, logical worker, position after it)."""

    def __init__(self, dataset, transform, collate, batch_size, seed, rank, world_size, num_workers):
        self.dataset, self.transform, self.collate = dataset, transform, collate
        self.batch_size, self.seed = batch_size, seed
        self.rank, self.world_size, self.num_workers = rank, world_size, max(num_workers, 1)
        self.epoch, self.first_worker, self.positions = 0, 0, {}

    def __iter__(self):
        info = get_worker_info()
        # the round robin starts at worker 0: on resume, worker 0 plays the worker that was next
        worker = ((info.id if info is not None else 0) + self.first_worker) % self.num_workers
        shard, shards = self.rank * self.num_workers + worker, self.world_size * self.num_workers
        dataset = self.dataset
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(self.epoch)
        own_sharding = callable(getattr(dataset, "set_shard", None))
        if own_sharding:
            dataset.set_shard(shard, shards)
        position = self.positions.get(worker)
        index = 0  # samples of the stream read so far (this shard's only, when the dataset shards itself)
        if position is not None:
            if position.get("done"):
                return
            dataset.load_state_dict(position["dataset"])
            index = position["index"]
        stateful, batch = is_stateful(dataset), []
        for sample in dataset:
            index += 1
            if not own_sharding and (index - 1) % shards != shard:
                continue
            if self.transform is not None:
                if info is not None:
                    _seed_sample(self.seed, self.epoch, shard, index)
                sample = self.transform(sample)
            batch.append(sample)
            if len(batch) == self.batch_size:
                yield self.collate(batch), worker, self._position(dataset, stateful, index)
                batch = []
        if batch:
            yield self.collate(batch), worker, dict(self._position(dataset, stateful, index), done=True)
        # a shard that ended with a whole batch says so in no batch: the main process learns it from the
        # loader's end, which is also where the epoch ends (a resume there starts the next epoch)

    @staticmethod
    def _position(dataset, stateful, index):
        return dict(dataset=dataset.state_dict(), index=index) if stateful else dict(index=index)


class StreamingData:
    """The loop's stream over an IterableDataset. Position (per rank) = (epoch, batches consumed in it, and
    for a stateful dataset every worker's state and which worker is next)."""
    per_rank_state = True  # the Checkpointer saves state_dict() of every rank (data_state_<rank>.pt)
    # no __len__: the trainer counts the run as one epoch (the schema requires train.max_steps)

    def __init__(self, dataset, cfg, seed, rank, world_size, device):
        if cfg.sampler:
            raise ConfigError("dataloaders.train.sampler: an IterableDataset orders its own samples; remove"
                              " the sampler")
        self.dataset, self.device = dataset, device
        self.stateful = is_stateful(dataset)
        self.batch_size, self.world_size, self.rank = cfg.batch_size_per_gpu, world_size, rank
        self.num_workers = cfg.num_workers
        transform = TRANSFORMS.build(cfg.transform) if cfg.transform else None
        collate = import_object(cfg.collate_fn) if cfg.collate_fn else default_collate
        self.shards = _ShardBatches(dataset, transform, collate, cfg.batch_size_per_gpu, seed, rank, world_size,
                                    cfg.num_workers)
        pin = cfg.pin_memory if cfg.pin_memory is not None else device.type == "cuda"
        extra = dict(prefetch_factor=cfg.prefetch_factor) if cfg.num_workers > 0 else {}
        # Workers are started afresh each epoch and at a resume: they read the positions when they start.
        self.loader = DataLoader(self.shards, batch_size=None, num_workers=cfg.num_workers, pin_memory=pin,
                                 persistent_workers=False, **extra)
        self.epoch, self.batch_in_epoch, self.samples_seen = 0, 0, 0
        self.positions, self.next_worker = {}, 0
        self._iter, self._skip = None, 0
        log.info("streaming data: an IterableDataset, %s", "stateful: resumes exactly" if self.stateful else
                 "without state_dict/load_state_dict: a resume reads the consumed batches of its epoch again")

    @property
    def global_batch(self):
        return self.batch_size * self.world_size

    def state_dict(self):
        return dict(epoch=self.epoch, batch_in_epoch=self.batch_in_epoch, samples_seen=self.samples_seen,
                    global_batch=self.global_batch, streaming=dict(
                        world_size=self.world_size, num_workers=self.num_workers, rank=self.rank,
                        next_worker=self.next_worker, positions=dict(self.positions) if self.stateful else None))

    def load_state_dict(self, state):
        self.epoch, self.batch_in_epoch = int(state["epoch"]), int(state["batch_in_epoch"])
        self.samples_seen = int(state.get("samples_seen", 0))
        saved = state.get("streaming") or {}
        self._iter, self.positions, self.next_worker, self._skip = None, {}, 0, 0
        if saved.get("rank", self.rank) != self.rank and saved.get("world_size") == self.world_size:
            return  # the main rank's state (training_state.pt); this rank's own file (data_state_R.pt) follows
        if (saved.get("world_size"), saved.get("num_workers")) != (self.world_size, self.num_workers):
            log.warning("resume: streaming data was sharded over %s ranks x %s workers, now %d x %d; epoch %d"
                        " starts again from its beginning", saved.get("world_size"), saved.get("num_workers"),
                        self.world_size, self.num_workers, self.epoch)
            self.batch_in_epoch = 0
        elif self.stateful:
            self.positions, self.next_worker = dict(saved["positions"]), int(saved["next_worker"])
        else:
            self._skip = self.batch_in_epoch
            if self._skip:
                log.info("resume: the streaming dataset has no state_dict; reading the %d consumed batches of"
                         " epoch %d again", self._skip, self.epoch)

    def _start(self):
        self.shards.epoch = self.epoch
        self.shards.positions, self.shards.first_worker = dict(self.positions), self.next_worker
        self._iter = iter(self.loader)
        for done in range(self._skip):
            try:
                next(self._iter)
            except StopIteration:  # the dataset shrank between runs: its epoch ended before the position
                log.warning("resume: the streaming dataset ended after %d of the %d batches consumed in epoch %d"
                            " (it is shorter than when saved); epoch %d starts", done, self._skip, self.epoch,
                            self.epoch + 1)
                self.epoch, self.batch_in_epoch, self.positions, self.next_worker = self.epoch + 1, 0, {}, 0
                self.shards.epoch, self.shards.positions, self.shards.first_worker = self.epoch, {}, 0
                self._iter = iter(self.loader)
                break
        self._skip = 0

    def __iter__(self):
        return self

    def __next__(self):
        for _ in range(2):  # an epoch that has just ended starts the next one
            if self._iter is None:
                self._start()
            try:
                batch, worker, position = next(self._iter)
                break
            except StopIteration:
                self.epoch, self.batch_in_epoch, self.positions, self.next_worker = self.epoch + 1, 0, {}, 0
                self._iter = None
        else:
            raise ConfigError(f"dataloaders.train.data_or_config: rank {self.rank}'s shard of the streaming"
                              f" dataset is empty ({self.world_size} ranks x {max(self.num_workers, 1)} workers)")
        self.positions[worker] = position
        self.next_worker = self._next_worker(worker)
        self.batch_in_epoch += 1
        self.samples_seen += self.global_batch
        return to_device(batch, self.device) if self.device.type == "cuda" else batch

    def _next_worker(self, worker):
        """The worker after `worker` in the round robin, skipping those whose shard has ended."""
        workers = max(self.num_workers, 1)
        for step in range(1, workers + 1):
            candidate = (worker + step) % workers
            if not (self.positions.get(candidate) or {}).get("done"):
                return candidate
        return worker


def is_streaming(data):
    """Whether data_or_config is (or names) an IterableDataset: streaming data (data/streaming.py)."""
    if isinstance(data, dict):
        try:
            cls, _ = DATASETS.resolve(data)
        except Exception:  # a giga_datasets name, or one check_data has already refused
            return False
        return isinstance(cls, type) and issubclass(cls, IterableDataset)
    return isinstance(data, IterableDataset)
