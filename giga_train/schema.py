"""The config schema (GigaTrain's names): defaults, and validation that answers in one line."""
import numbers

from .blocks import class_name_problem
from .checks import refuse_nan
from .compile import check_dynamo_config
from .config import Config
from .errors import ConfigError
from .fp8 import check_fp8_config
from .registry import OPTIMIZERS, SAMPLERS, STRATEGIES, TRANSFORMS, did_you_mean, import_object
from .schedulers import SCHEDULERS
from .schema_accelerate import check_cluster_key, dynamo_from_launch, normalise_deepspeed, normalise_fsdp
from .schema_data import check_built as _check_built, check_data as _check_data, check_streaming, is_streaming

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
        if self.min is not None and value is not None and value < self.min:
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


# GigaTrain's Launcher keys (distributed/launch.py) and ours. Its extra keys go to Accelerate's ClusterConfig:
# those are in CLUSTER below (honoured, or refused in one line by schema_accelerate.check_cluster_key).
LAUNCH = dict(
    gpu_ids=Key(None, (list, tuple)),  # one list, or one list per machine (normalised to this machine's list)
    num_processes=Key(1, int, min=1),
    distributed_type=Key(None, str),  # None: GigaTrain's default, MULTI_GPU (DDP) for several ranks, else NO
    fsdp_config=Key(None, dict),
    deepspeed_config=Key(None, dict),
    num_machines=Key(None, int, min=1),  # None: len(main_process_ip) when a list, else 1
    machine_rank=Key(0, int, min=0),
    main_process_ip=Key("127.0.0.1", (str, list, tuple)),  # a list: one per machine, the first is the main one
    main_process_port=Key(None, int, min=1),  # one machine: a free port; several: 29500
    max_restarts=Key(0, int, min=0),
    until_completion=Key(False, bool),  # relaunch (resuming) until the job exits 0
    num_cpu_threads_per_process=Key(None, int, min=1),  # OMP_NUM_THREADS per rank; None: cores / ranks
    nccl_socket_ifname=Key(None, str),  # NCCL_SOCKET_IFNAME for the ranks
    env=Key(None, dict, check=lambda v: None if all(isinstance(k, str) for k in v) else "keys must be strings"),
    executable=Key(None, str),  # GigaTrain: the `accelerate` CLI it runs; no effect here (no Accelerate)
    save_config_path=Key(None, str),  # GigaTrain: where it writes Accelerate's temporary config; no effect
    save_hostfile_path=Key(None, str),  # GigaTrain: its temporary pdsh hostfile; no effect
    # Accelerate's ClusterConfig
    rdzv_backend=Key(None, str, choices=("static", "c10d")),  # ours: c10d on one machine, static on several
    same_network=Key(None, bool),  # no effect (the machines reach main_process_ip)
    main_training_function=Key(None, str),  # notebook launcher only; no effect
    dynamo_config=Key(None, dict),  # Accelerate's form -> train.dynamo_config when that is unset
    collective_timeout=Key(None, numbers.Real, min=1),  # seconds (ours): the watchdog of every collective
)
CLUSTER_REFUSED = ("downcast_bf16", "tpu_name", "tpu_zone", "tpu_use_cluster", "tpu_use_sudo", "command_file",
                   "commands", "tpu_vm", "tpu_env", "megatron_lm_config", "mpirun_config", "parallelism_config",
                   "fp8_config", "enable_cpu_affinity")
# GigaTrain hands these to ClusterConfig itself: in `launch` they are a TypeError there, an answer here.
LAUNCH_ELSEWHERE = dict(mixed_precision="set train.mixed_precision", use_cpu="leave out gpu_ids to run on CPU",
                        debug="no debug mode", compute_environment="only the local machine environment exists")

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


def _positive(value):
    return None if value > 0 else f"must be > 0, got {value!r}"


def _unit_interval(value):
    return None if 0 < value < 1 else f"must be in (0, 1), got {value!r}"


TRAIN = dict(
    # GigaTrain's Trainer.__init__ keywords
    max_epochs=Key(None, int, min=0),  # 0 (GigaTrain's default): not set
    max_steps=Key(None, int, min=0),  # 0: not set
    gradient_accumulation_steps=Key(1, int, min=1),
    mixed_precision=Key("no", str, choices=MIXED_PRECISION),  # None: 'no'
    dynamo_config=Key(None, dict),
    ddp_config=Key(None, dict),  # DistributedDataParallel's keywords (Accelerate's DistributedDataParallelKwargs)
    fp8_config=Key(None, dict),
    data_parallel_size=Key(1, int, min=1),  # each batch is repeated this many times within the rank
    log_with=Key("tensorboard", (str, list, tuple)),  # normalised to a list of LOG_TRACKERS' names
    log_interval=Key(10, int, min=1),
    log_cpu_memory=Key(True, bool),  # the log line shows the process's resident memory
    checkpoint_interval=Key(None, numbers.Real, check=_positive),  # steps; by epochs: epochs (a float: a fraction)
    checkpoint_total_limit=Key(None, int),  # -1 / 0 (GigaTrain's default -1): no limit -> None
    checkpoint_keeps=Key([], (list, tuple), check=_list_of(int, "a step (by epochs: an epoch) number")),
    checkpoint_save_optimizer=Key(True, bool),  # False: only the two newest (and kept) keep the optimizer state
    checkpoint_safe_serialization=Key(True, bool),
    checkpoint_strict=Key(True, bool),
    activation_checkpointing=Key(False, bool),
    activation_class_names=Key([], (list, tuple), check=_list_of(str, "a class name")),
    with_ema=Key(False, bool),
    allow_tf32=Key(True, bool),  # TF32 matmul and cuDNN on CUDA
    seed=Key(6666, int, min=0),  # GigaTrain's default, so an unchanged config draws the same numbers
    logging_dir=Key(None, str),  # None: $AIHC_TENSORBOARD_LOG_PATH if non-empty, else {project_dir}/logs
    # GigaTrain's `kwargs` conventions (read from self.kwargs by its Trainer)
    max_grad_norm=Key(None, numbers.Real, min=0),
    grad_norm_type=Key(None, (numbers.Real, str)),  # None: 2; 'inf' allowed
    loss_nan_total_limit=Key(None, int),  # NaN steps in a row before the run stops; <= 0: never stop
    resume=Key(False, (bool, str)),
    # ours
    ema_decay=Key(0.9999, numbers.Real, check=_unit_interval),
    checkpoint_async=Key(False, bool),  # write checkpoints in a background thread (not under DEEPSPEED)
    progress_bar=Key(True, bool),
    nan_policy=Key("skip", str, choices=("skip", "stop", "off")),  # a non-finite loss/grad norm: skip the update
    max_nan_steps=Key(10, (int, type(None)), min=1),  # skipped steps in a row before the run stops (None: never)
    eval_interval=Key(None, int, min=1),  # validate on dataloaders.val every N steps and at the last (None: never)
    eval_ema=Key(False, bool),  # validate on the EMA weights (needs with_ema)
    checkpoint_best=Key(None, dict, check=lambda v: _check_best(v)),  # dict(metric='val/loss', mode='min')
    profile=Key(None, dict),  # a torch.profiler trace of chosen steps: PROFILE's keys
    count_flops=Key(False, bool),  # count one step's FLOPs (torch.utils.flop_counter): TFLOP/s and MFU logged
    flops_per_sample=Key(None, numbers.Real, check=_positive),  # or give them (forward + backward, one sample)
    tokens_per_sample=Key(None, int, min=1),  # logs tokens_per_sec
    peak_flops=Key(None, numbers.Real, check=_positive),  # FLOP/s of one device for MFU (None: known GPUs' bf16)
)
# In GigaTrain these are not Trainer keywords: they reach the trainer's self.kwargs, so they are in ours too.
# eval_interval too: ours validates by it, and forks of GigaTrain projects read it from self.kwargs for their own.
GIGATRAIN_KWARGS = ("max_grad_norm", "grad_norm_type", "loss_nan_total_limit", "resume", "eval_interval")
LOG_TRACKERS = ("tensorboard", "jsonl", "wandb")

PROFILE = dict(  # torch.profiler.schedule's steps (of this run), then torch.profiler.profile's switches
    skip_first=Key(0, int, min=0),
    wait=Key(5, int, min=0),  # past the first steps' compilation and allocator warm-up
    warmup=Key(1, int, min=0),
    active=Key(3, int, min=1),
    repeat=Key(1, int, min=0),  # windows; 0: until the run ends
    record_shapes=Key(False, bool),
    profile_memory=Key(False, bool),
    with_stack=Key(False, bool),
    with_flops=Key(False, bool),
)

TEST = dict(  # GigaTrain's Tester.__init__ keywords; other keys reach the tester's self.kwargs
    mixed_precision=Key("no", str, choices=MIXED_PRECISION),
    log_interval=Key(100, int, min=1),
    seed=Key(6666, int, min=0),
    logging_dir=Key(None, str),
)

DDP_KEYS = ("dim", "broadcast_buffers", "bucket_cap_mb", "find_unused_parameters", "check_reduction",
            "gradient_as_bucket_view", "static_graph", "comm_hook", "comm_wrapper", "comm_state_option")

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
OPEN_SECTIONS = {"train": TRAIN, "test": TEST}  # extra keys allowed (they become the runner's kwargs)


def edit_distance(a, b):
    """Optimal string alignment distance: insertions, deletions, substitutions, adjacent swaps."""
    a, b = a.lower(), b.lower()
    d = [[max(i, j) if not i * j else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[-1][-1]


def near_miss(key, known):
    """The known key that `key` is a typo of, or None. One edit away always; two edits when both names have
    at least 7 characters (short names two edits apart are different words: 'seed'/'speed' is one edit, but
    'resume'/'result' is two and both are plausible keys)."""
    best = None
    for name in known:
        distance = edit_distance(key, name)
        limit = 2 if min(len(key), len(name)) >= 7 else 1
        if 0 < distance <= limit and (best is None or distance < best[0]):
            best = (distance, name)
    return best and best[1]


def train_kwargs(section, schema=None):
    """The runner's `self.kwargs`: the keys of `section` (cfg.train, or cfg.test with TEST) that are not in the
    schema, plus GigaTrain's kwargs conventions that are set (its Trainer reads them from self.kwargs)."""
    schema = TRAIN if schema is None else schema
    extra = {k: v for k, v in section.items() if k not in schema}
    if schema is TRAIN:  # set, as GigaTrain's self.kwargs holds them only when the config gives them
        extra.update({k: section[k] for k in GIGATRAIN_KWARGS if section.get(k) != TRAIN[k].default})
    return extra


def tester_kwargs(section):
    return train_kwargs(section, TEST)


# GigaTrain writes None for "the default" in these; ours are the values our code reads.
NONE_MEANS = {"mixed_precision": "no", "log_with": [], "activation_class_names": [], "checkpoint_keeps": [],
              "max_epochs": 0, "max_steps": 0, "checkpoint_total_limit": -1, "resume": False}


def _fill(path, node, schema, open_keys=False):
    """Check `node` against a section schema and fill its defaults, in place. With `open_keys` (train, test),
    a key that is not in the schema is kept (it becomes the runner's kwargs) unless it is a near miss of one."""
    if not isinstance(node, dict):
        raise ConfigError(f"{path or 'config'}: expected a dict, got {type(node).__name__}")
    for key in node:
        if key in schema:
            continue
        where = f"{path}.{key}" if path else key
        if not open_keys:
            raise ConfigError(f"{where}: unknown key{did_you_mean(key, schema)}")
        if key == "project_dir":
            raise ConfigError(f"{where}: set project_dir at the top level (GigaTrain passes it to the runner itself)")
        typo = near_miss(key, schema)
        if typo:  # a typo must not become a silent kwarg
            raise ConfigError(f"{where}: unknown key; did you mean '{typo}'? (a key that is not one of"
                              f" {path}'s keys reaches the runner's self.kwargs, but this one is too close to '{typo}')")
    for key, spec in schema.items():
        where = f"{path}.{key}" if path else key
        if isinstance(spec, dict):
            node[key] = Config(node.get(key) or {})
            _fill(where, node[key], spec, open_keys=any(spec is s for s in OPEN_SECTIONS.values()))
        elif key not in node:
            if spec.default is REQUIRED:
                raise ConfigError(f"{where}: required key is missing")
            node[key] = Config(spec.default) if isinstance(spec.default, dict) else (
                list(spec.default) if isinstance(spec.default, list) else spec.default)
        else:
            value = node[key]
            if value is None and key in NONE_MEANS and open_keys:
                value = NONE_MEANS[key]
            node[key] = spec.validate(where, value)


def world_size_of(launch):
    """Ranks in the whole job: one per GPU id (or num_processes on CPU) on each machine."""
    per_machine = len(launch.gpu_ids) if launch.gpu_ids else launch.num_processes
    return per_machine * (launch.num_machines or 1)


def validate_config(cfg):
    """Fill defaults, normalise GigaTrain's forms and check every section before any work starts. Returns the
    imported runner objects (that each is a runner class is checked a layer up, in runners.py)."""
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
    _fill("", cfg, SECTIONS)
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
        from .distributed.deepspeed_config import resolve_deepspeed_config
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


def _pop_cluster_keys(launch):
    """Take Accelerate's ClusterConfig keys that are not launch keys out of `launch` (checked later)."""
    out = {}
    for key in list(launch):
        if key in LAUNCH_ELSEWHERE:
            raise ConfigError(f"launch.{key}: not a launch key ({LAUNCH_ELSEWHERE[key]})")
        if key in CLUSTER_REFUSED:
            out[key] = launch.pop(key)
    return out


def _check_launch(launch, train):
    launch.fsdp_config = launch.fsdp_config and Config(launch.fsdp_config)
    _machines(launch)
    kind = launch.distributed_type
    if kind is None:  # GigaTrain: MULTI_GPU when Accelerate starts several ranks
        kind = "NO" if world_size_of(launch) == 1 else "DDP"
    kind = {"MULTI_CPU": "DDP"}.get(kind.upper(), kind.upper())
    if kind not in STRATEGIES:
        raise ConfigError(f"launch.distributed_type: unknown {launch.distributed_type!r}"
                          f"{did_you_mean(launch.distributed_type, STRATEGIES.names())}"
                          f" (choose from {', '.join(STRATEGIES.names())})")
    launch.distributed_type = kind
    if launch.fsdp_config is not None or kind == "FSDP":
        launch.fsdp_config = Config(normalise_fsdp(launch.fsdp_config))  # the FSDP strategies read every key
        if launch.fsdp_config.fsdp_activation_checkpointing and not train.activation_checkpointing:
            # Accelerate checkpoints the wrapped blocks: the same as ours with the wrap classes
            train.activation_checkpointing = True
            if not train.activation_class_names:
                train.activation_class_names = list(launch.fsdp_config.fsdp_transformer_layer_cls_to_wrap or [])
    if launch.deepspeed_config is not None or kind == "DEEPSPEED":
        launch.deepspeed_config = _as_config(normalise_deepspeed(launch.deepspeed_config, train))
    if launch.dynamo_config is not None:
        mapped = dynamo_from_launch(launch.dynamo_config)
        if mapped and train.dynamo_config is None:
            train.dynamo_config = Config(mapped)  # train.dynamo_config wins, as GigaTrain's Trainer does
        launch.dynamo_config = None
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


def _as_config(value):
    return None if value is None else Config(value)


def _machines(launch):
    """GigaTrain's multi-machine forms: main_process_ip as a list (one per machine; num_machines inferred, the
    first is the main machine) and gpu_ids as one list per machine (this machine's list is kept)."""
    ips = launch.main_process_ip
    if isinstance(ips, (list, tuple)):
        if not ips or not all(isinstance(ip, str) for ip in ips):
            raise ConfigError(f"launch.main_process_ip: expected an address or a list of addresses, got {ips!r}")
        if launch.num_machines is not None and launch.num_machines != len(ips):
            raise ConfigError(f"launch.num_machines={launch.num_machines} but main_process_ip lists {len(ips)}"
                              " machines")
        launch.num_machines, launch.main_process_ip = len(ips), ips[0]
    launch.num_machines = launch.num_machines or 1
    ids = launch.gpu_ids
    if ids and all(isinstance(g, (list, tuple)) for g in ids):
        for i, one in enumerate(ids):
            problem = _list_of(int, "a GPU index")(one)
            if problem:
                raise ConfigError(f"launch.gpu_ids[{i}]: {problem}")
        if len(ids) != launch.num_machines:
            raise ConfigError(f"launch.gpu_ids: {len(ids)} lists for {launch.num_machines} machines (one per machine)")
        if len({len(one) for one in ids}) != 1:
            raise ConfigError(f"launch.gpu_ids: every machine must run as many ranks, got {[len(i) for i in ids]}")
        import os
        rank = int(os.environ.get("SLURM_NODEID", launch.machine_rank))
        if rank >= len(ids):
            raise ConfigError(f"launch.machine_rank={rank} but gpu_ids lists {len(ids)} machines")
        launch.gpu_ids = list(ids[rank])
    elif ids:
        problem = _list_of(int, "a GPU index (or one list per machine)")(ids)
        if problem:
            raise ConfigError(f"launch.gpu_ids: {problem}")
    if launch.machine_rank >= launch.num_machines:
        raise ConfigError(f"launch.machine_rank={launch.machine_rank} but num_machines={launch.num_machines}")


def _check_precision_device(cfg):
    if cfg.train.mixed_precision == "fp16" and not cfg.launch.gpu_ids and cfg.launch.distributed_type != "NO":
        raise ConfigError(f"train.mixed_precision: 'fp16' needs GPUs under {cfg.launch.distributed_type}"
                          " (gloo on CPU has no fp16 path); use 'bf16' or 'no' on CPU")


def resolve_logging_dir(project_dir, logging_dir, environ=None):
    """GigaTrain's rule: logging_dir, else a non-empty $AIHC_TENSORBOARD_LOG_PATH, else {project_dir}/logs;
    ~ and $VARS expanded."""
    import os
    environ = os.environ if environ is None else environ
    if logging_dir is None:
        logging_dir = environ.get("AIHC_TENSORBOARD_LOG_PATH")
    if not logging_dir:
        return os.path.join(project_dir.rstrip("/") or "/", "logs")
    return os.path.expanduser(os.path.expandvars(logging_dir))


def _check_train(train, project_dir, given=()):
    train.max_steps = train.max_steps or None  # 0: not set
    train.max_epochs = train.max_epochs or None
    if train.max_steps is None and train.max_epochs is None:
        raise ConfigError("train: set max_steps or max_epochs")
    if train.max_steps is not None and train.max_epochs is not None:
        raise ConfigError(f"train: set max_steps ({train.max_steps}) or max_epochs ({train.max_epochs}), not both")
    if train.checkpoint_total_limit is not None and train.checkpoint_total_limit <= 0:
        train.checkpoint_total_limit = None  # GigaTrain's -1 (and 0): keep every checkpoint
    interval = train.checkpoint_interval  # None by epochs: every epoch, GigaTrain's default (checkpoint_steps)
    if interval is not None and train.max_epochs is None and interval != int(interval):
        raise ConfigError(f"train.checkpoint_interval: {interval!r} steps is not a whole number (a fraction of an"
                          " epoch needs max_epochs)")
    if interval is not None and train.max_epochs is None:
        train.checkpoint_interval = int(interval)
    train.log_with = _trackers(train.log_with)
    if train.profile is not None:
        _fill("train.profile", train.profile, PROFILE)
    if train.count_flops and train.flops_per_sample is not None:
        raise ConfigError("train: count_flops and flops_per_sample both given; count them or give them")
    if train.mixed_precision == "fp8":
        import torch
        if not torch.cuda.is_available():
            raise ConfigError("train.mixed_precision: 'fp8' needs a CUDA GPU (use 'bf16' on CPU)")
    if train.fp8_config and "backend" in train.fp8_config:
        backend = str(train.fp8_config.backend).lower()
        if backend not in ("ao", "torchao"):
            raise ConfigError(f"train.fp8_config.backend: {train.fp8_config.backend!r} (Transformer Engine) is not"
                              " used: giga-train's fp8 is torchao; remove backend/recipe_kwargs, set recipe=...")
        train.fp8_config = Config({k: v for k, v in train.fp8_config.items() if k != "backend"})
    for key, check in (("dynamo_config", check_dynamo_config), ("fp8_config", check_fp8_config),
                       ("ddp_config", _check_ddp_config)):
        problem = train[key] and check(train[key])
        if problem:
            raise ConfigError(f"train.{key}: {problem}")
    if train.eval_ema and not train.with_ema:
        raise ConfigError("train.eval_ema: needs train.with_ema=True (the EMA weights to validate on)")
    if train.checkpoint_best and not train.eval_interval:
        raise ConfigError("train.checkpoint_best: set train.eval_interval too (the validations it compares)")
    if train.activation_checkpointing and not train.activation_class_names:
        raise ConfigError("train.activation_class_names: name the module classes to checkpoint"
                          " (activation_checkpointing=True)")
    if train.checkpoint_total_limit is not None and train.checkpoint_interval is None and train.max_epochs is None:
        raise ConfigError("train.checkpoint_total_limit: set checkpoint_interval too")
    if isinstance(train.resume, str) and not train.resume:
        raise ConfigError("train.resume: give True, False, or a checkpoint folder")
    if isinstance(train.grad_norm_type, str):
        if train.grad_norm_type.strip().lower() not in ("inf", "infinity"):
            raise ConfigError(f"train.grad_norm_type: expected a number or 'inf', got {train.grad_norm_type!r}")
        train.grad_norm_type = float("inf")
    if train.grad_norm_type is not None:
        train.grad_norm_type = float(train.grad_norm_type)
    if train.loss_nan_total_limit is not None:  # GigaTrain's NaN limit: ours counts skipped steps in a row
        limit = train.loss_nan_total_limit if train.loss_nan_total_limit > 0 else None
        if "max_nan_steps" in given and train.max_nan_steps != limit:
            raise ConfigError("train: loss_nan_total_limit and max_nan_steps disagree; give one")
        train.max_nan_steps = limit
    for name in train.activation_class_names:
        problem = class_name_problem(name)
        if problem:
            raise ConfigError(f"train.activation_class_names: {problem}")
    train.logging_dir = resolve_logging_dir(project_dir, train.logging_dir)


def checkpoint_steps(train, epoch_size):
    """Optimizer steps between periodic checkpoints (None: none), from the normalised train section.

    By epochs, checkpoint_interval counts epochs (0.5: every half epoch; at least one step). GigaTrain does this
    only while checkpoint_interval < max_epochs and otherwise reads the same number as steps (max_epochs=1,
    checkpoint_interval=3: every 3 steps); here it is always epochs when training by epochs (listed difference)."""
    interval = train.checkpoint_interval
    if interval is None and train.max_epochs is not None:
        interval = 1  # GigaTrain's default (1): every epoch
    if interval is None:
        return None  # by steps: no periodic checkpoint (GigaTrain's default 1 would save every step)
    if train.max_epochs is not None:
        return max(1, int(interval * epoch_size))
    return int(interval)


def _trackers(value):
    """log_with: a name or a list (GigaTrain hands it to Accelerate) -> a list of the trackers to open."""
    import importlib.util
    names = [value] if isinstance(value, str) else list(value)
    out = []
    for name in names:
        if not isinstance(name, str):
            raise ConfigError(f"train.log_with: expected tracker names, got {name!r}")
        name = name.strip().lower()
        if name == "all":  # Accelerate: every tracker that is installed
            wanted = ["tensorboard", "jsonl"] + (["wandb"] if importlib.util.find_spec("wandb") else [])
        elif name in ("none", "no", ""):
            wanted = []
        elif name == "wandb" and not importlib.util.find_spec("wandb"):
            raise ConfigError("train.log_with: 'wandb' needs the wandb package: pip install 'giga-train[wandb]'"
                              " (WANDB_MODE=offline writes the run under logging_dir without an account)")
        elif name in LOG_TRACKERS:
            wanted = [name]
        else:
            raise ConfigError(f"train.log_with: {name!r} is not supported (choose from tensorboard, jsonl, wandb,"
                              f" all, none){did_you_mean(name, LOG_TRACKERS)}")
        out += [w for w in wanted if w not in out]
    return out


def _check_best(best):
    unknown = sorted(set(best) - {"metric", "mode"})
    if unknown:
        return f"unknown key '{unknown[0]}'{did_you_mean(unknown[0], ('metric', 'mode'))} (give metric and mode)"
    if not isinstance(best.get("metric"), str) or not best["metric"].startswith("val/"):
        return f"metric: name a validation result, e.g. 'val/loss'; got {best.get('metric')!r}"
    if best.get("mode", "min") not in ("min", "max"):
        return f"mode: 'min' or 'max', got {best['mode']!r}"
    return None


def _check_ddp_config(cfg):
    for key in cfg:
        if key not in DDP_KEYS:
            return f"unknown key '{key}'{did_you_mean(key, DDP_KEYS)} (keys: {', '.join(DDP_KEYS)})"
    for key in ("comm_hook", "comm_wrapper"):
        value = cfg.get(key)
        allowed = ("no", "fp16", "bf16") + (("power_sgd", "batched_power_sgd") if key == "comm_hook" else ())
        if value is not None and str(value).lower() not in allowed:
            return f"{key}: {value!r} is not one of {', '.join(allowed)}"
    return None


def _check_test(test, project_dir):
    test.logging_dir = resolve_logging_dir(project_dir, test.logging_dir)


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
