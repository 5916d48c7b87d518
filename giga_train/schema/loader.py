"""The config schema's dataloader sections (GigaTrain's keys): what each may hold; the datasets, samplers and
transforms they name are checked by classes.py."""
from ..errors import ConfigError
from ..registry import SAMPLERS, TRANSFORMS, import_object
from .classes import check_built as _check_built, check_data as _check_data
from .keys import REQUIRED, Key, _fill


LOADER = dict(
    data_or_config=Key(REQUIRED),  # a dataset folder, dict(_class_name=...), a list of them, or a Dataset
    batch_size_per_gpu=Key(1, int, min=1),
    num_workers=Key(0, int, min=0),
    transform=Key(None, (dict, list, tuple)),
    sampler=Key(None, dict),
    batch_sampler=Key(None, dict),  # GigaTrain: replaces sampler + BatchSampler (gets batch_size_per_gpu too)
    filter=Key(None, dict),  # GigaTrain: dataset.filter(**filter) (giga_datasets)
    collator=Key(None, dict),  # GigaTrain: giga_datasets.DefaultCollator(**collator)
    collate_fn=Key(None, str),
    pin_memory=Key(None, bool),
    prefetch_factor=Key(None, int, min=1),
    persistent_workers=Key(False, bool),
)


def _check_loader(where, loader, required=True, open_keys=False):
    """A dataloader section. `open_keys`: a runner builds its own dataloaders (overrides get_dataloaders), so
    keys we do not know are its own and are kept; the ones we know are still checked."""
    if not isinstance(loader, dict):
        raise ConfigError(f"{where}: expected a dict, got {type(loader).__name__}")
    if not required and "data_or_config" not in loader:
        schema = dict(LOADER, data_or_config=Key(None))
    else:
        schema = LOADER
    if open_keys:
        extra = {k: loader.pop(k) for k in list(loader) if k not in schema}
    _fill(where, loader, schema)
    if open_keys:
        loader.update(extra)
    data = loader.data_or_config
    if data is not None:
        _check_data(f"{where}.data_or_config", data)
    if loader.transform is not None:
        for i, one in enumerate([loader.transform] if isinstance(loader.transform, dict) else loader.transform):
            if not isinstance(one, dict):
                raise ConfigError(f"{where}.transform: expected dict(type=...) or a list of them, got {one!r}")
            _check_built(f"{where}.transform" + ("" if isinstance(loader.transform, dict) else f"[{i}]"),
                         TRANSFORMS, one)
    if loader.sampler is not None and loader.batch_sampler is not None:
        raise ConfigError(f"{where}: give sampler or batch_sampler, not both (batch_sampler replaces the sampler)")
    if loader.sampler is not None:
        _check_built(f"{where}.sampler", SAMPLERS, loader.sampler,
                     supplied=("dataset", "batch_size", "seed", "rank", "world_size"), giga_datasets="sampler")
    if loader.batch_sampler is not None:
        _check_built(f"{where}.batch_sampler", SAMPLERS, loader.batch_sampler,
                     supplied=("dataset", "batch_size", "batch_size_per_gpu", "seed", "rank", "world_size"),
                     giga_datasets="sampler")
    if loader.collator is not None and loader.collate_fn is not None:
        raise ConfigError(f"{where}: give collator (GigaTrain's) or collate_fn, not both")
    if loader.filter is not None:
        func = loader.filter.get("func")
        if func is not None and not callable(func):
            try:
                import_object(func)
            except Exception as e:
                raise ConfigError(f"{where}.filter.func: cannot import '{func}': {type(e).__name__}: {e}") from None
    if loader.collate_fn is not None:
        try:
            import_object(loader.collate_fn)
        except Exception as e:
            raise ConfigError(f"{where}.collate_fn: cannot import '{loader.collate_fn}': {e}") from None
