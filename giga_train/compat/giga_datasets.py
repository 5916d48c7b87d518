"""GigaTrain's data path through giga_datasets (the optional `gigatrain` extra): a dataloaders section's
`data_or_config`, `filter`, `transform` and `collator` mean what they mean in GigaTrain 1.1 (docs/guide.md,
"Data through giga_datasets"; docs/GIGATRAIN.md section 13). Without the package, an entry that needs it
raises one line naming it."""
import os

import torch

from ..errors import ConfigError
from ..registry import DATASETS, TYPE_KEYS, import_object

INSTALL = "pip install -e '.[gigatrain]' then pip install --no-deps giga-datasets==1.1.0, see docs/guide.md"


def import_giga_datasets(where):
    """The giga_datasets package, or a one-line ConfigError naming it."""
    try:
        import giga_datasets
    except Exception as e:  # not installed, or its own imports fail (a torchvision built for another torch)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(f"{where}: needs the giga-datasets package ({INSTALL}); import giga_datasets failed:"
                          f" {type(e).__name__}: {first}") from None
    return giga_datasets


def _is_ours(cfg):
    name = next((cfg[k] for k in TYPE_KEYS if k in cfg), None)
    return not isinstance(name, str) or name in DATASETS or "." in name


# giga_datasets' datasets registered only when an optional package imports (giga_datasets/datasets/__init__.py)
NEEDS_PACKAGE = {"LeRobotDataset": "lerobot", "LeRobotVQADataset": "lerobot"}


def missing_package_line(where, name):
    """The one line for a giga_datasets dataset that its optional package would register, or None."""
    package = NEEDS_PACKAGE.get(name)
    if package is None:
        return None
    return (f"{where}: dataset '{name}' is giga_datasets', registered only when the {package} package imports, and"
            f" it does not here: pip install {package} (giga-datasets 1.1 pins lerobot==0.4.4, which needs"
            f" torch<2.11)")


def load_dataset(data_or_config, where="data_or_config"):
    """(dataset, opened_by_giga_datasets) for GigaTrain's `data_or_config` forms; a Dataset object as it is."""
    if isinstance(data_or_config, dict) and _is_ours(data_or_config):
        return DATASETS.build(data_or_config), False
    if isinstance(data_or_config, (list, tuple)):
        children = [load_dataset(one, f"{where}[{i}]") for i, one in enumerate(data_or_config)]
        datasets = [d for d, _ in children]
        try:  # giga_datasets' ConcatDataset (its filter and samplers know it), as GigaTrain's
            return import_giga_datasets(where).ConcatDataset(datasets), True
        except ConfigError:
            if any(by_giga for _, by_giga in children):
                raise
            return torch.utils.data.ConcatDataset(datasets), False  # only ours, and no giga_datasets
    if isinstance(data_or_config, str):
        if not os.path.exists(data_or_config):
            raise ConfigError(f"{where}: no dataset folder or config file '{data_or_config}'")
        return import_giga_datasets(where).load_dataset(data_or_config), True
    if isinstance(data_or_config, dict):
        gd = import_giga_datasets(where)
        from giga_datasets.datasets.dataset import DATASETS as registered
        name = next((data_or_config[k] for k in TYPE_KEYS if k in data_or_config), None)
        if name not in registered:
            if missing_package_line(where, name):
                raise ConfigError(missing_package_line(where, name))
            raise ConfigError(f"{where}: unknown dataset '{name}' (neither giga-train's DATASETS nor"
                              f" giga_datasets' register_dataset know it)")
        return gd.load_dataset(dict(data_or_config)), True
    return data_or_config, False


def open_dataset(cfg, transform, where):
    """(dataset, transform left to the loader, collate_fn) for a dataloaders section `cfg`."""
    dataset, by_giga = load_dataset(cfg.data_or_config, f"{where}.data_or_config")
    if cfg.get("filter") is not None:
        if not callable(getattr(dataset, "filter", None)):
            raise ConfigError(f"{where}.filter: {type(dataset).__name__} has no filter method (giga_datasets'"
                              " datasets have one)")
        dataset.filter(**cfg.filter)
    # GigaTrain's contract: a giga_datasets dataset applies the transform in __getitem__ (set, None included, as
    # GigaTrain does). A Dataset object of the user's keeps its own unless the config names one, and a Hugging
    # Face dataset's is never touched (its set_transform takes batches; the user's set_transform/with_transform
    # stays): the loader applies the config's transform to each sample there.
    hugging_face = type(dataset).__module__.split(".", 1)[0] == "datasets"
    if callable(getattr(dataset, "set_transform", None)) and not hugging_face and (by_giga or transform is not None):
        dataset.set_transform(transform)
        transform = None
    if cfg.get("collate_fn"):
        collate = import_object(cfg.collate_fn)
    elif cfg.get("collator") is not None or by_giga:
        collate = import_giga_datasets(f"{where}.collator").DefaultCollator(**(cfg.get("collator") or {}))
    else:
        collate = None  # torch's default_collate
    return dataset, transform, collate


# GigaTrain registers the first five in its SAMPLERS; the weighted ones are giga_datasets' too.
# DefaultSampler stays ours: the same order, cut per rank and positioned on resume.
SAMPLER_NAMES = ("AspectRatioSampler", "BucketBatchSampler", "BucketSampler", "SpecialDatasetSampler",
                 "WeightedSampler", "ListWeightedSampler", "ShardedListWeightedSampler")


def register_samplers(registry):
    """A SAMPLERS provider: giga_datasets' samplers under their names, when the package imports."""
    try:
        import giga_datasets
    except Exception:  # not installed (or not importable): a config naming one gets the registry's error
        return
    for name in SAMPLER_NAMES:
        if hasattr(giga_datasets, name) and name not in registry:
            registry.register(getattr(giga_datasets, name), name=name)
