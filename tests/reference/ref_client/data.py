"""A tiny regression data set, usable three ways:

- as a plain map-style ``torch.utils.data.Dataset`` (``TinyRegression(size=22)``);
- through giga_datasets' path, the way GigaTrain 1.1's ``Trainer.get_dataloaders`` loads data
  (``load_dataset(dict(_class_name='TinyRegression', ...))`` -> ``TinyRegression.load(config)``,
  then ``dataset.filter(**filter)`` if asked and ``dataset.set_transform(transform)``);
- by class name from a config (``_class_name``) in any framework that builds a dataset from a dict.

Every sample is ``dict(index=<int>, x=<float32 (4,)>, y=<float32 ()>)``; ``index`` lets a recorder
see which samples each step got, in which order.
"""
import torch


class TinyRegression(torch.utils.data.Dataset):
    def __init__(self, size: int = 22, dim: int = 4, seed: int = 0, **unused):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, dim, generator=g)
        w = torch.linspace(-1.0, 1.0, dim)
        self.y = self.x @ w + 0.1 * torch.randn(size, generator=g)
        self.transform = None

    @classmethod
    def load(cls, config):
        kwargs = {k: v for k, v in dict(config).items() if not k.startswith('_') and k not in ('config_path', 'data_path')}
        return cls(**kwargs)

    def set_transform(self, transform):
        self.transform = transform

    def filter(self, mode=None, **kwargs):
        raise NotImplementedError('TinyRegression has no filters')

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        sample = dict(index=int(index), x=self.x[index], y=self.y[index])
        if self.transform is not None:
            sample = self.transform(sample)
        return sample


try:  # GigaTrain's data path resolves `_class_name` through giga_datasets' registry.
    from giga_datasets import register_dataset
except ImportError:  # no giga_datasets: a framework with a dataset registry of its own (giga-train's)
    import giga_train
    if hasattr(giga_train, 'DATASETS'):
        giga_train.DATASETS.register(TinyRegression)
else:
    register_dataset(TinyRegression)


def write_pkl_dataset(folder, size=22, dim=4, seed=0, start=0, buckets=None):
    """Write samples start..start+size-1 of ``TinyRegression(size=start+size, ...)`` as a giga_datasets
    ``PklDataset`` folder: ``data.pkl`` (a pickled list of sample dicts, numpy values) and
    ``config.json`` (``_class_name``, ``_key_names``, ``data_size``), the layout giga_datasets'
    PklWriter writes. Plain pickle/json: needs no giga_datasets to write. ``buckets``: each sample also
    gets ``bucket_index = index % buckets`` (what giga_datasets' BucketSampler groups by)."""
    import json
    import os
    import pickle

    full = TinyRegression(size=start + size, dim=dim, seed=seed)
    os.makedirs(folder, exist_ok=True)
    samples = [dict(index=i, x=full.x[i].numpy(), y=full.y[i].numpy()) for i in range(start, start + size)]
    if buckets:
        for sample in samples:
            sample['bucket_index'] = sample['index'] % buckets
    with open(os.path.join(folder, 'data.pkl'), 'wb') as f:
        pickle.dump(samples, f)
    with open(os.path.join(folder, 'config.json'), 'w') as f:
        json.dump(dict(_class_name='PklDataset', _key_names=sorted(samples[0]), data_size=size), f, indent=4)
    return folder


def write_bucketed_dataset(folder, size, start, buckets=3):
    """A giga_datasets ``Dataset`` folder over one PklDataset (``pkl/``) whose samples carry
    ``bucket_index``: its bucket and aspect-ratio samplers read only that layout (``Dataset`` or a
    ``ConcatDataset`` of them); ``config.json`` as ``Dataset.save`` writes it."""
    import json
    import os

    write_pkl_dataset(os.path.join(folder, 'pkl'), size=size, start=start, buckets=buckets)
    with open(os.path.join(folder, 'config.json'), 'w') as f:
        json.dump(dict(_class_name='Dataset', config_paths=['pkl/config.json']), f, indent=4)
    return folder
