"""The config schema (GigaTrain's names): defaults, and validation that answers in one line."""
import numbers

from .blocks import class_name_problem
from .compile import check_dynamo_config
from .config import Config
from .errors import ConfigError, RegistryError
from .fp8 import check_fp8_config
from .registry import (DATASETS, OPTIMIZERS, SAMPLERS, SCHEDULERS, STRATEGIES, TRANSFORMS, TYPE_KEYS, did_you_mean,
                       import_object)

REQUIRED = object()
MIXED_PRECISION = ("no", "fp16", "bf16", "fp8")


class Key:
    def __init__(self, default, types=None, choices=None, check=None, min=None):
        self.default, self.types, self.choices, self.check, self.min = default, types, choices, check, min

    def validate(self, path, value):
        if value is None and (self.default is None or self.types is None):
            return value
        if self.types is not None and not _is_instance(value, self.types):
            raise ConfigError(f"{path}: expected {_type_names(self.types)}, got {type(value).__name__} {value!r}")
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"{path}: {value!r} is not one of {', '.join(map(repr, self.choices))}"
                              f"{did_you_mean(value, self.choices)}")
        if self.min is not None and value < self.min:
            raise ConfigError(f"{path}: must be >= {self.min}, got {value!r}")
        if self.check is not None:
            message = self.check(value)
            if message:
                raise ConfigError(f"{path}: {message}")
        return value


def _is_instance(value, types):
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool) and bool not in types:
        return False  # True is an int to Python, but never a step count
    return isinstance(value, types)


def _type_names(types):
    types = types if isinstance(types, tuple) else (types,)
    names = {int: "an integer", numbers.Real: "a number", str: "a string", bool: "true/false",
             list: "a list", dict: "a dict", type(None): "None"}
    return " or ".join(names.get(t, t.__name__) for t in types)


def _list_of(kind, what):
    def check(value):
        bad = [v for v in value if not _is_instance(v, kind)]
        return f"every entry must be {what}, got {bad[0]!r}" if bad else None
    return check


LAUNCH = dict(
    gpu_ids=Key(None, (list, tuple), check=_list_of(int, "a GPU index")),
    num_processes=Key(1, int, min=1),
    distributed_type=Key("NO", str),
    fsdp_config=Key(None, dict),
    deepspeed_config=Key(None, dict),
    num_machines=Key(1, int, min=1),
    machine_rank=Key(0, int, min=0),
    main_process_ip=Key("127.0.0.1", str),
    main_process_port=Key(None, int, min=1),  # one machine: a free port; several: 29500
    max_restarts=Key(0, int, min=0),
)

FSDP = dict(
    fsdp_version=Key(2, int, choices=(1, 2)),
    fsdp_auto_wrap_policy=Key("TRANSFORMER_BASED_WRAP", str, choices=("TRANSFORMER_BASED_WRAP", "NO_WRAP")),
    fsdp_transformer_layer_cls_to_wrap=Key(None, (str, list, tuple)),
    fsdp_cpu_ram_efficient_loading=Key(False, bool),
    fsdp_state_dict_type=Key("FULL_STATE_DICT", str, choices=("FULL_STATE_DICT", "SHARDED_STATE_DICT")),
    fsdp_reshard_after_forward=Key(True, bool),
)

LOADER = dict(
    data_or_config=Key(REQUIRED),
    batch_size_per_gpu=Key(1, int, min=1),
    num_workers=Key(0, int, min=0),
    transform=Key(None, dict),
    sampler=Key(None, dict),
    collate_fn=Key(None, str),
    pin_memory=Key(None, bool),
    prefetch_factor=Key(None, int, min=1),
    persistent_workers=Key(False, bool),
)

TRAIN = dict(
    max_steps=Key(None, int, min=1),
    max_epochs=Key(None, int, min=1),
    gradient_accumulation_steps=Key(1, int, min=1),
    max_grad_norm=Key(None, numbers.Real, min=0),
    mixed_precision=Key("no", str, choices=MIXED_PRECISION),
    activation_checkpointing=Key(False, bool),
    activation_class_names=Key([], (list, tuple), check=_list_of(str, "a class name")),
    dynamo_config=Key(None, dict),
    fp8_config=Key(None, dict),
    checkpoint_interval=Key(None, int, min=1),
    checkpoint_total_limit=Key(None, int, min=1),
    checkpoint_keeps=Key([], (list, tuple), check=_list_of(int, "a step number")),
    checkpoint_safe_serialization=Key(True, bool),
    checkpoint_strict=Key(True, bool),
    checkpoint_async=Key(False, bool),  # write checkpoints in a background thread (not under DEEPSPEED)
    resume=Key(False, (bool, str)),
    with_ema=Key(False, bool),
    ema_decay=Key(0.9999, numbers.Real, check=lambda v: None if 0 < v < 1 else f"must be in (0, 1), got {v!r}"),
    log_with=Key("tensorboard", str, choices=("tensorboard", "none")),
    log_interval=Key(10, int, min=1),
    seed=Key(42, int, min=0),
    progress_bar=Key(True, bool),
    nan_policy=Key("skip", str, choices=("skip", "stop", "off")),  # a non-finite loss/grad norm: skip the update
    max_nan_steps=Key(10, int, min=1),  # skipped steps in a row before the run stops
)

SECTIONS = dict(
    runners=Key(REQUIRED, (str, list, tuple)),
    project_dir=Key(REQUIRED, str),
    launch=LAUNCH,
    dataloaders=Key(REQUIRED, dict),
    models=Key({}, dict),
    optimizers=Key(dict(type="AdamW", lr=1e-4), dict),
    schedulers=Key(dict(type="ConstantScheduler"), dict),
    train=TRAIN,
)


def _fill(path, node, schema):
    """Check `node` against a section schema and fill its defaults, in place."""
    if not isinstance(node, dict):
        raise ConfigError(f"{path or 'config'}: expected a dict, got {type(node).__name__}")
    for key in node:
        if key not in schema:
            where = f"{path}.{key}" if path else key
            raise ConfigError(f"{where}: unknown key{did_you_mean(key, schema)}")
    for key, spec in schema.items():
        where = f"{path}.{key}" if path else key
        if isinstance(spec, dict):
            node[key] = Config(node.get(key) or {})
            _fill(where, node[key], spec)
        elif key not in node:
            if spec.default is REQUIRED:
                raise ConfigError(f"{where}: required key is missing")
            node[key] = Config(spec.default) if isinstance(spec.default, dict) else (
                list(spec.default) if isinstance(spec.default, list) else spec.default)
        else:
            node[key] = spec.validate(where, node[key])


def world_size_of(launch):
    """Ranks in the whole job: one per GPU id (or num_processes on CPU) on each machine."""
    per_machine = len(launch.gpu_ids) if launch.gpu_ids else launch.num_processes
    return per_machine * launch.num_machines


def validate_config(cfg):
    """Fill defaults and check every section before any work starts. Returns the imported runner objects
    (that each is a runner class is checked a layer up, in runners.py)."""
    _fill("", cfg, SECTIONS)
    runners = [cfg.runners] if isinstance(cfg.runners, str) else list(cfg.runners)
    if not runners:
        raise ConfigError("runners: needs at least one dotted path to a Trainer subclass")
    cfg.runners = runners
    # Imported first: their modules may register the datasets, transforms... that the checks below look up.
    classes = [_import_runner(f"runners[{i}]", path) for i, path in enumerate(runners)]
    _check_launch(cfg.launch)
    _check_train(cfg.train)
    _check_precision_device(cfg)
    if "train" not in cfg.dataloaders:
        raise ConfigError(f"dataloaders.train: required key is missing{did_you_mean('train', cfg.dataloaders)}")
    for name, loader in cfg.dataloaders.items():
        _fill(f"dataloaders.{name}", loader, LOADER)
        _check_loader(f"dataloaders.{name}", loader)
    if cfg.launch.distributed_type == "DEEPSPEED":
        from .distributed.deepspeed_config import resolve_deepspeed_config
        resolve_deepspeed_config(cfg.launch.deepspeed_config, cfg.train, cfg.dataloaders.train.batch_size_per_gpu,
                                 world_size_of(cfg.launch))
    _check_built("optimizers", OPTIMIZERS, cfg.optimizers, supplied=("params",))
    _check_built("schedulers", SCHEDULERS, cfg.schedulers, supplied=("optimizer",))
    return classes


def _import_runner(where, path):
    try:
        return import_object(path)
    except Exception as e:  # the user's module may raise anything while importing
        raise ConfigError(f"{where}: cannot import '{path}': {type(e).__name__}: {e}") from None


def _check_launch(launch):
    if launch.distributed_type not in STRATEGIES:
        raise ConfigError(f"launch.distributed_type: unknown {launch.distributed_type!r}"
                          f"{did_you_mean(launch.distributed_type, STRATEGIES.names())}"
                          f" (choose from {', '.join(STRATEGIES.names())})")
    if launch.fsdp_config is not None or launch.distributed_type == "FSDP":
        launch.fsdp_config = Config(launch.fsdp_config or {})  # the FSDP strategies read every key filled in
        _fill("launch.fsdp_config", launch.fsdp_config, FSDP)
    if launch.gpu_ids:
        import torch
        if not torch.cuda.is_available():
            raise ConfigError(f"launch.gpu_ids={list(launch.gpu_ids)}: no CUDA GPU is visible on this machine"
                              " (remove gpu_ids to run on CPU)")
        count = torch.cuda.device_count()
        bad = [g for g in launch.gpu_ids if not 0 <= g < count]
        if bad:
            raise ConfigError(f"launch.gpu_ids: GPU {bad[0]} does not exist (this machine has {count})")
        if len(set(launch.gpu_ids)) != len(launch.gpu_ids):
            raise ConfigError(f"launch.gpu_ids: {list(launch.gpu_ids)} names a GPU twice")


def _check_precision_device(cfg):
    if cfg.train.mixed_precision == "fp16" and not cfg.launch.gpu_ids and cfg.launch.distributed_type != "NO":
        raise ConfigError(f"train.mixed_precision: 'fp16' needs GPUs under {cfg.launch.distributed_type}"
                          " (gloo on CPU has no fp16 path); use 'bf16' or 'no' on CPU")


def _check_train(train):
    if train.max_steps is None and train.max_epochs is None:
        raise ConfigError("train: set max_steps or max_epochs")
    if train.mixed_precision == "fp8":
        import torch
        if not torch.cuda.is_available():
            raise ConfigError("train.mixed_precision: 'fp8' needs a CUDA GPU (use 'bf16' on CPU)")
    for key, check in (("dynamo_config", check_dynamo_config), ("fp8_config", check_fp8_config)):
        problem = train[key] and check(train[key])
        if problem:
            raise ConfigError(f"train.{key}: {problem}")
    if train.activation_checkpointing and not train.activation_class_names:
        raise ConfigError("train.activation_class_names: name the module classes to checkpoint"
                          " (activation_checkpointing=True)")
    if train.checkpoint_total_limit is not None and train.checkpoint_interval is None:
        raise ConfigError("train.checkpoint_total_limit: set checkpoint_interval too")
    if isinstance(train.resume, str) and not train.resume:
        raise ConfigError("train.resume: give True, False, or a checkpoint folder")
    for name in train.activation_class_names:
        problem = class_name_problem(name)
        if problem:
            raise ConfigError(f"train.activation_class_names: {problem}")


def _check_loader(where, loader):
    data = loader.data_or_config
    if isinstance(data, dict):
        _check_built(f"{where}.data_or_config", DATASETS, data)
    elif not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
        raise ConfigError(f"{where}.data_or_config: expected a map-style Dataset or dict(_class_name=...),"
                          f" got {type(data).__name__}")
    if loader.transform is not None:
        _check_built(f"{where}.transform", TRANSFORMS, loader.transform)
    if loader.sampler is not None:
        _check_built(f"{where}.sampler", SAMPLERS, loader.sampler,
                     supplied=("dataset", "batch_size", "seed", "rank", "world_size"))
    if loader.collate_fn is not None:
        try:
            import_object(loader.collate_fn)
        except Exception as e:
            raise ConfigError(f"{where}.collate_fn: cannot import '{loader.collate_fn}': {e}") from None


def _check_built(where, registry, cfg, supplied=()):
    if not any(k in cfg for k in TYPE_KEYS):
        raise ConfigError(f"{where}: needs 'type' naming one of {', '.join(registry.names())}")
    try:
        registry.check_arguments(cfg, supplied)
    except RegistryError as e:
        raise ConfigError(f"{where}: {e}") from None
