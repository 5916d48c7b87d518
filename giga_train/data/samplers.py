"""DefaultSampler: a seeded global order, cut so that the ranks' batches together make the global batch."""
import torch
from torch.utils.data import Sampler

from ..registry import SAMPLERS


@SAMPLERS.register
class DefaultSampler(Sampler):
    """Yields this rank's sample indices for one epoch.

    Global batch g holds order[g*B*W : (g+1)*B*W]; rank r takes the r-th slice of B. So one process
    with batch B*W sees exactly the union of W ranks' batches of B, step for step. The position is
    counted in global samples, which is what makes resuming exact (and possible at another world size).
    `drop_last=False` wraps the order around to fill the last global batch.
    """

    def __init__(self, dataset, batch_size=1, shuffle=True, seed=0, rank=0, world_size=1, drop_last=False):
        self.size = len(dataset)
        if self.size == 0:
            raise ValueError("the dataset is empty")
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.rank, self.world_size, self.drop_last = rank, world_size, drop_last
        self.epoch = 0
        self.start_sample = 0  # global samples of this epoch already consumed

    @property
    def global_batch(self):
        return self.batch_size * self.world_size

    @property
    def num_batches(self):
        """Global batches (= this rank's batches) in one epoch."""
        full, rest = divmod(self.size, self.global_batch)
        return full if self.drop_last or rest == 0 else full + 1

    def set_epoch(self, epoch, start_sample=0):
        self.epoch, self.start_sample = epoch, start_sample

    def _order(self):
        if not self.shuffle:
            order = torch.arange(self.size)
        else:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.size, generator=g)
        total = self.num_batches * self.global_batch
        if total > self.size:
            order = order.repeat((total + self.size - 1) // self.size)
        return order[:total]

    def __iter__(self):
        order = self._order().view(self.num_batches, self.world_size, self.batch_size)
        first = self.start_sample // self.global_batch
        return iter(order[first:, self.rank].reshape(-1).tolist())

    def __len__(self):
        return (self.num_batches - self.start_sample // self.global_batch) * self.batch_size
