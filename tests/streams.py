"""Streaming datasets for the tests: item i is {"index": i}, in an order that depends on the epoch."""
import os

import torch
from torch.utils.data import IterableDataset

from giga_train import Trainer


class CountingStream(IterableDataset):
    """Not stateful: a resume reads the consumed batches again (exact: the order depends only on the epoch)."""

    def __init__(self, size=37):
        self.size, self.epoch = size, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def order(self):
        return torch.randperm(self.size, generator=torch.Generator().manual_seed(self.epoch)).tolist()

    def __iter__(self):
        for i in self.order():
            yield {"index": torch.tensor(i)}


class StatefulCountingStream(CountingStream):
    """Stateful (torchdata's protocol): state_dict() is the position after the last sample given out."""

    def __init__(self, size=37):
        super().__init__(size)
        self.position, self.loaded = 0, False

    def state_dict(self):
        return {"position": self.position, "epoch": self.epoch}

    def load_state_dict(self, state):
        self.position, self.epoch, self.loaded = state["position"], state["epoch"], True

    def __iter__(self):
        if not self.loaded:
            self.position = 0
        self.loaded = False
        order = self.order()
        while self.position < len(order):
            self.position += 1
            yield {"index": torch.tensor(order[self.position - 1])}


class ShardedStatefulStream(StatefulCountingStream):
    """Shards itself (set_shard): each worker reads only its own samples."""

    def set_shard(self, index, count):
        self.shard, self.shards = index, count

    def order(self):
        return super().order()[self.shard::self.shards]


class StreamTrainer(Trainer):
    """Fits a line to the indices it is fed, appending every index it sees to seen_<rank>.txt."""

    def get_models(self, model_config):
        torch.manual_seed(0)
        return torch.nn.Linear(1, 1)

    def forward_step(self, batch_dict):
        index = batch_dict["index"]
        with open(os.path.join(self.project_dir, f"seen_{self.rank}.txt"), "a") as f:
            f.write(" ".join(map(str, index.tolist())) + "\n")
        x = index.float()[:, None] / 40
        return (self.model(x) - x * 2 + 1).pow(2).mean()
