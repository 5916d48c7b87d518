"""The config schema (GigaTrain's names): defaults, and validation that answers in one line.

The whole config is checked here, section by section: launch.py (launch), train.py (train, test), loader.py
(dataloaders), compat/accelerate.py (Accelerate's forms), classes.py (the classes a section names), on keys.py's
Key."""
from .values import refuse_nan
from ..config import Config
from ..errors import ConfigError
from ..registry import OPTIMIZERS, did_you_mean, import_object
from ..schedulers import SCHEDULERS
from ..compat.accelerate import check_cluster_key
from .constructors import check_constructors
from .classes import check_built as _check_built, check_streaming, is_streaming
from .keys import REQUIRED, Key, _fill, edit_distance, near_miss
from .parallelism import check_parallelism
from .launch import LAUNCH, _check_launch, _pop_cluster_keys, world_size_of
from .loader import LOADER, _check_loader
from .train import (OPEN_SECTIONS, TEST, TRAIN, _check_test, _check_train, checkpoint_steps,
                           resolve_logging_dir, tester_kwargs, train_kwargs)

# What projects and tests import from here (the names live in the modules above)
__all__ = ["LAUNCH", "LOADER", "SECTIONS", "TEST", "TRAIN", "checkpoint_steps", "edit_distance", "near_miss",
           "resolve_logging_dir", "tester_kwargs", "train_kwargs", "validate_config", "world_size_of"]


SECTIONS = dict(
    runners=Key(REQUIRED, (str, list, tuple)),
    project_dir=Key(REQUIRED, str),
    launch=LAUNCH,
    dataloaders=Key(REQUIRED, dict),
    models=Key({}, dict),
    optimizers=Key(dict(type="AdamW", lr=1e-4), (dict, list, tuple)),
    schedulers=Key(dict(type="ConstantScheduler"), (dict, list, tuple)),
    train=TRAIN,
    test=TEST,
)


def validate_config(cfg):
    """Fill defaults, normalise GigaTrain's forms and check every section before any work starts. Returns the
    imported runner objects (that each is a runner class is checked a layer up, in launch/runners.py)."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"config: expected a dict, got {type(cfg).__name__}")
    for name, spec in SECTIONS.items():  # a section given as anything but a dict: one line, not a traceback
        if isinstance(spec, dict) and cfg.get(name) is not None and not isinstance(cfg[name], dict):
            raise ConfigError(f"{name}: expected a dict (the {name} section), got {type(cfg[name]).__name__}"
                              f" {cfg[name]!r}")
    launch_in = dict(cfg.get("launch") or {})
    cluster = _pop_cluster_keys(launch_in)
    cfg["launch"] = Config(launch_in)
    given_train = set(cfg.get("train") or ())
    _fill("", cfg, SECTIONS, open_sections=OPEN_SECTIONS.values())
    refuse_nan(cfg)  # max_grad_norm=nan passes every finiteness guard and writes NaN weights
    runners = [cfg.runners] if isinstance(cfg.runners, str) else list(cfg.runners)
    if isinstance(cfg.runners, str) and "," in cfg.runners:
        runners = [r.strip() for r in cfg.runners.split(",") if r.strip()]  # GigaTrain's --runners a,b form
    if not runners:
        raise ConfigError("runners: needs at least one dotted path to a Trainer subclass")
    cfg.runners = runners
    # Imported first: their modules may register the datasets, transforms... that the checks below look up.
    classes = [_import_runner(f"runners[{i}]", path) for i, path in enumerate(runners)]
    _check_train(cfg.train, cfg.project_dir, given_train)
    _check_launch(cfg.launch, cfg.train)
    check_parallelism(cfg.launch, cfg.models, world_size_of(cfg.launch))
    for key, value in cluster.items():
        check_cluster_key(key, value)
    _check_precision_device(cfg)
    _check_test(cfg.test, cfg.project_dir)
    own_loaders = any(_overrides(cls, "get_dataloaders") for cls in classes)
    if "train" not in cfg.dataloaders:
        raise ConfigError(f"dataloaders.train: required key is missing{did_you_mean('train', cfg.dataloaders)}")
    for name in list(cfg.dataloaders):
        loader = cfg.dataloaders[name]
        if loader is None and name != "train":
            del cfg.dataloaders[name]  # GigaTrain configs write `eval=None` for "no such loader"
            continue
        _check_loader(f"dataloaders.{name}", loader, required=name == "train", open_keys=own_loaders)
    # eval_interval alone is a GigaTrain fork's own kwarg as well (its trainer validates itself): no val, no error
    val = cfg.dataloaders.get("val")
    if cfg.train.eval_interval and val is not None and val.get("data_or_config") is None:
        raise ConfigError("train.eval_interval: set dataloaders.val.data_or_config too (the data to validate on)")
    for key in ("checkpoint_best", "eval_ema"):
        if cfg.train[key] and val is None:
            raise ConfigError(f"train.{key}: set dataloaders.val too (the data to validate on)")
    train_data = cfg.dataloaders.train.data_or_config
    if not own_loaders and is_streaming(train_data):
        check_streaming("dataloaders.train", cfg.dataloaders.train, cfg.train)
    if cfg.launch.distributed_type == "DEEPSPEED":
        from ..engine.deepspeed_config import resolve_deepspeed_config
        resolve_deepspeed_config(cfg.launch.deepspeed_config, cfg.train, cfg.dataloaders.train.batch_size_per_gpu,
                                 world_size_of(cfg.launch))
    for where, registry, supplied in (("optimizers", OPTIMIZERS, ("params",)),
                                      ("schedulers", SCHEDULERS, ("optimizer",))):
        entries = cfg[where]
        if isinstance(entries, dict):
            _check_built(where, registry, entries, supplied=supplied)
        else:  # GigaTrain: one per model, or one over all models
            for i, entry in enumerate(entries):
                if not isinstance(entry, dict):
                    raise ConfigError(f"{where}[{i}]: expected a dict with 'type', got {type(entry).__name__}")
                _check_built(f"{where}[{i}]", registry, entry, supplied=supplied)
    _check_optimizer_layout(cfg)
    check_constructors(cfg)  # what the optimizers' and schedulers' own constructors refuse
    return classes


def _check_optimizer_layout(cfg):
    """FSDP1 hands the optimizer each weight's shard as a flat 1-D view: an optimizer that factors 2-D
    weights (CAME8Bit) would silently keep unfactored fp32 state there, so refuse it up front."""
    if cfg.launch.distributed_type != "FSDP" or cfg.launch.fsdp_config.fsdp_version != 1:
        return
    entries = [cfg.optimizers] if isinstance(cfg.optimizers, dict) else list(cfg.optimizers)
    for i, entry in enumerate(entries):
        cls, _ = OPTIMIZERS.resolve(entry)
        refusal = getattr(cls, "FSDP1_REFUSAL", None)
        if refusal:
            where = "optimizers" if isinstance(cfg.optimizers, dict) else f"optimizers[{i}]"
            raise ConfigError(f"{where}.type={cls.__name__}: {refusal}")


def _overrides(cls, method):
    """True when a runner class (or a base of it outside giga_train) defines `method` itself."""
    for klass in getattr(cls, "__mro__", ()):
        if method in vars(klass):
            return not klass.__module__.startswith("giga_train.")
    return False


def _import_runner(where, path):
    try:
        return import_object(path)
    except Exception as e:  # the user's module may raise anything while importing
        raise ConfigError(f"{where}: cannot import '{path}': {type(e).__name__}: {e}") from None


def _check_precision_device(cfg):
    if cfg.train.mixed_precision == "fp16" and not cfg.launch.gpu_ids and cfg.launch.distributed_type != "NO":
        raise ConfigError(f"train.mixed_precision: 'fp16' needs GPUs under {cfg.launch.distributed_type}"
                          " (gloo on CPU has no fp16 path); use 'bf16' or 'no' on CPU")
