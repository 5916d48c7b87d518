"""The config schema (GigaTrain's names): defaults, and validation that answers in one line.

The whole config is checked here, section by section: launch.py (launch), train.py (train, test), loader.py
(dataloaders), compat/accelerate.py (Accelerate's forms), classes.py (the classes a section names), on keys.py's
Key."""
import copy

from .values import refuse_nan
from ..config import Config
from ..engine import strategy_class
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
from .model_paths import check_model_paths
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


class ValidConfig(Config):
    """A config validate_config filled and checked: what runners are built from, validated nowhere again.
    `engine_settings` (an attribute, not a key): what the engine's check_config derived from it."""
    engine_settings = None

    def __deepcopy__(self, memo):
        copied = ValidConfig({k: copy.deepcopy(v, memo) for k, v in self.items()})
        object.__setattr__(copied, "engine_settings", copy.deepcopy(self.engine_settings, memo))
        return copied


def validated(cfg, runners=None):
    """`cfg` itself when validate_config made it, else validate_config(cfg, runners)."""
    return cfg if isinstance(cfg, ValidConfig) else validate_config(cfg, runners)


def validate_config(cfg, runners=None):
    """Fill defaults, normalise GigaTrain's forms and check every section before any work starts, the
    engine's own rules (its check_config) and each runner class's (its check_config) included. `cfg` is
    filled in place; returns it as a ValidConfig. `runners`: the runner classes themselves (a Trainer built
    directly in Python), for a config without a `runners` key."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"config: expected a dict, got {type(cfg).__name__}")
    if runners is not None and not cfg.get("runners"):
        cfg["runners"] = [f"{c.__module__}.{c.__qualname__}" for c in runners]  # what config.json records
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
    paths = [cfg.runners] if isinstance(cfg.runners, str) else list(cfg.runners)
    if isinstance(cfg.runners, str) and "," in cfg.runners:
        paths = [r.strip() for r in cfg.runners.split(",") if r.strip()]  # GigaTrain's --runners a,b form
    if not paths:
        raise ConfigError("runners: needs at least one dotted path to a Trainer subclass")
    cfg.runners = paths
    # Imported first: their modules may register the datasets, transforms... that the checks below look up.
    classes = list(runners) if runners is not None else [_import_runner(f"runners[{i}]", path)
                                                         for i, path in enumerate(cfg.runners)]
    cfg.runners = [_dotted(one) for one in cfg.runners]
    # Runners that only test (GigaTrain's Tester) need no train keys nor training data.
    tester_only = all(getattr(cls, "SECTION", None) == "test" for cls in classes)
    _check_train(cfg.train, cfg.project_dir, given_train, tester_only=tester_only)
    _check_launch(cfg.launch, cfg.train)
    check_parallelism(cfg.launch, cfg.models, world_size_of(cfg.launch))
    for key, value in cluster.items():
        check_cluster_key(key, value)
    _check_precision_device(cfg)
    _check_test(cfg.test, cfg.project_dir, cfg.train.log_with)
    own_loaders = any(_overrides(cls, "get_dataloaders") for cls in classes)
    if "train" not in cfg.dataloaders and not tester_only:
        raise ConfigError(f"dataloaders.train: required key is missing{did_you_mean('train', cfg.dataloaders)}")
    for name in list(cfg.dataloaders):
        loader = cfg.dataloaders[name]
        if loader is None and name != "train":
            del cfg.dataloaders[name]  # GigaTrain configs write `eval=None` for "no such loader"
            continue
        _check_loader(f"dataloaders.{name}", loader, required=name == "train" and not own_loaders,
                      open_keys=own_loaders)  # an own get_dataloaders may return the data itself
    # eval_interval alone is a GigaTrain fork's own kwarg as well (its trainer validates itself): no val, no error
    val = cfg.dataloaders.get("val")
    if cfg.train.eval_interval and val is not None and val.get("data_or_config") is None:
        raise ConfigError("train.eval_interval: set dataloaders.val.data_or_config too (the data to validate on)")
    for key in ("checkpoint_best", "early_stopping", "eval_ema"):
        if cfg.train[key] and val is None:
            raise ConfigError(f"train.{key}: set dataloaders.val too (the data to validate on)")
    train_data = (cfg.dataloaders.get("train") or {}).get("data_or_config")
    if not own_loaders and train_data is not None and is_streaming(train_data):
        check_streaming("dataloaders.train", cfg.dataloaders.train, cfg.train)
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
    check_constructors(cfg)  # what the optimizers' and schedulers' own constructors refuse
    check_model_paths(cfg.models)
    valid = cfg if isinstance(cfg, ValidConfig) else ValidConfig(cfg)  # the same sections, filled above
    settings = strategy_class(valid.launch).check_config(valid)  # what the engine refuses at set-up
    object.__setattr__(valid, "engine_settings", settings)
    for i, (path, cls) in enumerate(zip(cfg.runners, classes)):
        if not (isinstance(cls, type) and callable(getattr(cls, "check_config", None))
                and hasattr(cls, "SECTION")):
            raise ConfigError(f"runners[{i}]: '{path}' is not a subclass of giga_train.Trainer or giga_train.Tester")
        if cls.SECTION not in cfg and cls.SECTION != "train":
            raise ConfigError(f"runners[{i}]: '{path}' runs the '{cls.SECTION}' section, which the config lacks")
        cls.check_config(valid)  # the runner's own rules (a project's subclass may add some)
    return valid


def _overrides(cls, method):
    """True when a runner class (or a base of it outside giga_train) defines `method` itself."""
    for klass in getattr(cls, "__mro__", ()):
        if method in vars(klass):
            return not klass.__module__.startswith("giga_train.")
    return False


def _import_runner(where, path):
    """A runner class from its dotted path (or the class itself, given from Python); one line when it is not
    there, with import_object's did-you-mean (a module or a class misspelt, or in the wrong case)."""
    if isinstance(path, type):
        return path
    try:
        return import_object(path)
    except Exception as e:  # the user's module may raise anything while importing
        raise ConfigError(f"{where}: cannot import '{path}': {type(e).__name__}: {e}") from None


def _dotted(runner):
    """A runner class given from Python as its dotted path where that imports back to it (config.json, worker
    processes); a class defined in a script (__main__) stays the object."""
    if not isinstance(runner, type) or runner.__module__ == "__main__":
        return runner
    path = f"{runner.__module__}.{runner.__qualname__}"
    try:
        return path if import_object(path) is runner else runner
    except Exception:  # defined inside a function, or its module not importable by that name
        return runner


def _check_precision_device(cfg):
    if cfg.train.loss_normalization == "tokens" and cfg.launch.distributed_type == "DEEPSPEED":
        raise ConfigError("train.loss_normalization: 'tokens' is not supported under DEEPSPEED (its engine holds the"
                          " gradients); use FSDP or DDP, or 'mean'")
    if cfg.train.mixed_precision == "fp16" and not cfg.launch.gpu_ids and cfg.launch.distributed_type != "NO":
        raise ConfigError(f"train.mixed_precision: 'fp16' needs GPUs under {cfg.launch.distributed_type}"
                          " (gloo on CPU has no fp16 path); use 'bf16' or 'no' on CPU")
