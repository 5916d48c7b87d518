"""Hugging Face `datasets` as training data: a `datasets.Dataset` (map-style) and a streaming
`datasets.IterableDataset`, taken with the format and transform the user gave them (set_transform,
with_transform, set_format are theirs: never reset).

A map-style Dataset needs nothing of its own: it has a length and integer indexing, so our positioned
sampler orders it and resumes it exactly. A streaming one is wrapped in HFStreaming, which gives the
streaming path (streaming.py) what it asks of a dataset: set_shard (datasets' split_dataset_by_node:
whole shards per part when they divide evenly, else every count-th example), set_epoch, and
state_dict/load_state_dict (datasets' own resumable state) for an exact resume."""
from torch.utils.data import IterableDataset


def _module_root(obj):
    return type(obj).__module__.split(".", 1)[0]


def is_hf_dataset(obj):
    """A Hugging Face `datasets.Dataset` or `datasets.IterableDataset` (not a DatasetDict of splits)."""
    if _module_root(obj) != "datasets":
        return False
    import datasets
    return isinstance(obj, (datasets.Dataset, datasets.IterableDataset))


def dataset_dict_refusal(where, obj):
    """The line for a `datasets.DatasetDict` (what load_dataset returns without split=) where one dataset
    belongs; None for anything else."""
    if _module_root(obj) != "datasets" or not isinstance(obj, dict):
        return None
    splits = list(obj)
    return (f"{where}: a {type(obj).__name__} of splits {splits}: give one split, e.g."
            f" dataset[{(splits or ['train'])[0]!r}] (or load_dataset(..., split={(splits or ['train'])[0]!r}))")


def is_hf_streaming(dataset):
    if _module_root(dataset) != "datasets":
        return False
    import datasets
    return isinstance(dataset, datasets.IterableDataset)


class HFStreaming(IterableDataset):
    """A `datasets.IterableDataset` as one shard of the streaming path. Iterated through datasets' `iter()`
    (one example at a time), which leaves the worker split to us: datasets' own `__iter__` would split its
    shards among DataLoader workers a second time."""

    def __init__(self, dataset):
        self.dataset, self.part = dataset, dataset

    def set_shard(self, index, count):
        from datasets.distributed import split_dataset_by_node
        self.part = split_dataset_by_node(self.dataset, rank=index, world_size=count) if count > 1 else self.dataset

    def set_epoch(self, epoch):
        self.dataset.set_epoch(epoch)  # the order of a shuffled stream (datasets: seed + epoch)
        if self.part is not self.dataset:
            self.part.set_epoch(epoch)

    def state_dict(self):
        return self.part.state_dict()

    def load_state_dict(self, state):
        self.part.load_state_dict(state)

    def __iter__(self):
        for batch in self.part.iter(batch_size=1):
            yield {key: value[0] for key, value in batch.items()}


def as_streaming(dataset):
    """The dataset the streaming path reads: a datasets.IterableDataset wrapped, any other as it is."""
    return HFStreaming(dataset) if is_hf_streaming(dataset) else dataset


__all__ = ["HFStreaming", "as_streaming", "dataset_dict_refusal", "is_hf_dataset", "is_hf_streaming"]
