"""The config schema's checks of what names a class to build: datasets (ours, or giga_datasets' when it is
installed, as GigaTrain resolves them), samplers, optimizers, schedulers; one line for a bad name or argument."""
from torch.utils.data import IterableDataset

from ..compat.giga_datasets import SAMPLER_NAMES, import_giga_datasets, missing_package_line
from ..data.hf_datasets import dataset_dict_refusal
from ..data.streaming import is_streaming  # noqa: F401  (validate.py takes it from here)
from ..errors import ConfigError, RegistryError
from ..registry import DATASETS, TYPE_KEYS, check_call_arguments


def check_data(where, data):
    """GigaTrain's data_or_config: a dataset folder, dict(_class_name=...), a list of those, or a Dataset."""
    if dataset_dict_refusal(where, data):
        raise ConfigError(dataset_dict_refusal(where, data))
    if isinstance(data, str):
        return  # a giga_datasets folder: opened when the dataloader is built (which needs the package)
    if isinstance(data, dict):
        check_built(where, DATASETS, data, giga_datasets="dataset")
    elif isinstance(data, (list, tuple)):
        if not data:
            raise ConfigError(f"{where}: an empty list names no dataset")
        for i, one in enumerate(data):
            if isinstance(one, (list, tuple)):
                raise ConfigError(f"{where}[{i}]: expected a folder, a dict or a Dataset, not a nested list")
            check_data(f"{where}[{i}]", one)
    elif not isinstance(data, IterableDataset) and (not hasattr(data, "__getitem__") or not hasattr(data, "__len__")):
        raise ConfigError(f"{where}: expected a dataset folder, dict(_class_name=...), a list of them, a"
                          f" map-style Dataset or an IterableDataset, got {type(data).__name__}")


def check_streaming(where, loader, train):
    """What streaming data cannot have: a sampler (the dataset orders itself), epochs (it has no length)."""
    for key in ("sampler", "batch_sampler"):
        if loader.get(key) is not None:
            raise ConfigError(f"{where}.{key}: an IterableDataset orders (and shards) its own samples; remove it")
    if train.max_epochs is not None:
        raise ConfigError(f"train.max_epochs: {where}.data_or_config is an IterableDataset (streaming, no length):"
                          " set train.max_steps instead")


def check_built(where, registry, cfg, supplied=(), giga_datasets=None):
    """A registered name and the arguments its class takes. With `giga_datasets` ('dataset' or 'sampler'), a name
    our registry lacks may be one of giga_datasets' (GigaTrain's data companion, when installed): GigaTrain looks
    `_class_name` up in its dataset registry (the class's load(config) takes the whole dict) and registers its
    samplers in SAMPLERS."""
    if not any(k in cfg for k in TYPE_KEYS):
        raise ConfigError(f"{where}: needs 'type' naming one of {', '.join(registry.names())}")
    name = next(cfg[k] for k in TYPE_KEYS if k in cfg)
    if giga_datasets and isinstance(name, str) and name not in registry and "." not in name:
        if giga_datasets == "sampler" and name in SAMPLER_NAMES:
            import_giga_datasets(where)  # GigaTrain's sampler names: one line naming the package if it is missing
        cls = _giga_datasets_class(name, giga_datasets)
        if cls is not None:
            if giga_datasets == "sampler":
                kwargs = {k: v for k, v in cfg.items() if k not in TYPE_KEYS}
                try:
                    check_call_arguments(cls, kwargs, supplied, what=f"giga_datasets.{name}")
                except RegistryError as e:
                    raise ConfigError(f"{where}: {e}") from None
            return
        if giga_datasets == "dataset" and missing_package_line(where, name):
            raise ConfigError(missing_package_line(where, name))
    try:
        registry.check_arguments(cfg, supplied)
    except RegistryError as e:
        raise ConfigError(f"{where}: {e}") from None


def _giga_datasets_class(name, kind):
    """giga_datasets' dataset (by its registry) or sampler `name`, or None (not there, or not installed)."""
    try:
        import giga_datasets
        if kind == "dataset":
            from giga_datasets.datasets.dataset import DATASETS as registered
            return registered.get(name)
    except Exception:  # not installed, or its own imports fail: our registries alone answer
        return None
    return getattr(giga_datasets, name, None)
