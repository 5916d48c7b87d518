"""The config schema's `train` and `test` sections (GigaTrain's Trainer and Tester keywords, and ours): their
keys, their checks, the runner's kwargs, and what the trainer derives from them (logging folder, checkpoint
interval)."""
import numbers

from ..engine.attention import ATTENTION_BACKENDS
from ..engine.activation_checkpointing import CHECKPOINTING_VALUES, memory_budget_bytes
from ..engine.block_classes import class_name_problem
from ..engine.compile import check_dynamo_config
from ..config import Config
from ..errors import ConfigError
from ..engine.fp8 import check_fp8_config
from ..registry import did_you_mean
from .keys import Key, _fill, _list_of, _positive, _unit_interval
from .lora import check_lora


MIXED_PRECISION = ("no", "fp16", "bf16", "fp8")


TRAIN = dict(
    # GigaTrain's Trainer.__init__ keywords
    max_epochs=Key(None, int, min=0),  # 0 (GigaTrain's default): not set
    max_steps=Key(None, int, min=0),  # 0: not set
    gradient_accumulation_steps=Key(1, int, min=1),
    mixed_precision=Key(None, str, choices=MIXED_PRECISION),  # None: as 'no'; a Trainer's keeps the value given
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
    activation_checkpointing=Key(False, (bool, str), check=lambda v: _check_checkpointing(v)),  # True: every block
    checkpointing_memory_budget=Key(None, (numbers.Real, str), check=lambda v: _check_budget(v)),  # for 'auto'
    activation_class_names=Key([], (list, tuple), check=_list_of(str, "a class name")),
    with_ema=Key(False, bool),
    allow_tf32=Key(True, bool),  # TF32 matmul and cuDNN on CUDA
    seed=Key(6666, int, min=0),  # GigaTrain's default, so an unchanged config draws the same numbers
    logging_dir=Key(None, str),  # None: $AIHC_TENSORBOARD_LOG_PATH if non-empty, else {project_dir}/logs
    # GigaTrain's `kwargs` conventions (read from self.kwargs by its Trainer)
    max_grad_norm=Key(None, numbers.Real, min=0),
    grad_norm_type=Key(None, (numbers.Real, str)),  # None: 2; 'inf' allowed
    loss_nan_total_limit=Key(None, int),  # NaN steps in a row tolerated (the next stops the run); <= 0: never stop
    resume=Key(False, (bool, str)),
    # ours
    ema_decay=Key(0.9999, numbers.Real, check=_unit_interval),
    checkpoint_async=Key(False, bool),  # write checkpoints in a background thread (not under DEEPSPEED)
    progress_bar=Key(True, bool),
    dry_run=Key(False, (bool, int)),  # N steps (True: 2) and a short validation, no checkpoint nor tracker
    # TensorBoard/wandb tags of the scalars: 'grouped' (train/total_loss, train/mse, val/...) or 'gigatrain'
    # (GigaTrain's bare total_loss, mse: its users' dashboards and scripts read those)
    log_tags=Key("grouped", str, choices=("grouped", "gigatrain")),
    nan_policy=Key("skip", str, choices=("skip", "stop", "off")),  # a non-finite loss/grad norm: skip the update
    max_nan_steps=Key(10, (int, type(None)), min=1),  # skipped steps in a row before the run stops (None: never)
    # fp16: steps the loss scaler skipped in a row (inf/nan gradients) before the run stops (None: never); the run
    # also stops when the scale falls below 1 (trainers/nan_guard.py). From the default scale 2**16 that is
    # 17 skips; a scale that had grown to 2**24 would halve 25 times before reaching it.
    max_overflow_steps=Key(30, (int, type(None)), min=1),
    eval_interval=Key(None, int, min=1),  # validate on dataloaders.val every N steps and at the last (None: never)
    eval_ema=Key(False, bool),  # validate on the EMA weights (needs with_ema)
    checkpoint_best=Key(None, dict, check=lambda v: _check_best(v)),  # dict(metric='val/loss', mode='min')
    # stop when metric has not improved by more than min_delta for patience validations (docs/guide.md)
    early_stopping=Key(None, dict, check=lambda v: _check_early_stopping(v)),  # dict(metric='val/loss', patience=3)
    # 'tokens': forward_step returns dict(loss_sum=, num_tokens=); the loss is the token mean over the
    # accumulation and the ranks (one big batch's), not the mean of the micro-batches' means (docs/guide.md)
    loss_normalization=Key("mean", str, choices=("mean", "tokens")),  # tokens: forward_step returns dict(loss_sum, num_tokens)
    profile=Key(None, dict),  # a torch.profiler trace of chosen steps: PROFILE's keys
    count_flops=Key(False, bool),  # count one step's FLOPs (torch.utils.flop_counter): TFLOP/s and MFU logged
    flops_per_sample=Key(None, numbers.Real, check=_positive),  # or give them (forward + backward, one sample)
    tokens_per_sample=Key(None, int, min=1),  # logs tokens_per_sec
    peak_flops=Key(None, numbers.Real, check=_positive),  # FLOP/s of one device for MFU (None: known GPUs' bf16)
    attention_backend=Key(None, str, choices=tuple(ATTENTION_BACKENDS)),  # SDPA's kernel (None: torch's choice)
    # checkpoints then hold the adapter only (docs/guide.md, "LoRA")
    lora=Key(None, dict),  # a LoRA adapter peft adds to get_models' model: dict(target_modules=[...], rank=8, alpha=8)
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
    log_with=Key(None, (str, list, tuple)),
)  # log_with is ours (GigaTrain's Tester has no trackers): docs/config.md says what it means


DDP_KEYS = ("dim", "broadcast_buffers", "bucket_cap_mb", "find_unused_parameters", "check_reduction",
            "gradient_as_bucket_view", "static_graph", "comm_hook", "comm_wrapper", "comm_state_option")


OPEN_SECTIONS = {"train": TRAIN, "test": TEST}  # extra keys allowed (they become the runner's kwargs)


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


def _check_train(train, project_dir, given=(), tester_only=False):
    train.max_steps = train.max_steps or None  # 0: not set
    train.max_epochs = train.max_epochs or None
    if train.max_steps is None and train.max_epochs is None and not tester_only:
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
    if train.lora is not None:
        train.lora = check_lora(train.lora)
    if train.count_flops and train.flops_per_sample is not None:
        raise ConfigError("train: count_flops and flops_per_sample both given; count them or give them")
    if train.mixed_precision == "fp8":
        import importlib.util
        import torch
        if importlib.util.find_spec("torchao") is None:
            raise ConfigError("train.mixed_precision: 'fp8' needs the torchao package, not installed here"
                              " (pip install torchao, or giga-train[fp8]); use 'bf16' without it")
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
    for key in ("checkpoint_best", "early_stopping"):
        if train[key] and not train.eval_interval:
            raise ConfigError(f"train.{key}: set train.eval_interval too (the validations it compares)")
    if train.activation_checkpointing and not train.activation_class_names:
        raise ConfigError("train.activation_class_names: name the module classes to checkpoint"
                          f" (activation_checkpointing={train.activation_checkpointing!r})")
    if train.checkpointing_memory_budget is not None and train.activation_checkpointing != "auto":
        raise ConfigError("train.checkpointing_memory_budget: only used with activation_checkpointing='auto'")
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
        # GigaTrain tolerates `limit` NaN steps and stops in the next one (count > limit): ours stops at the
        # (limit + 1)-th skipped step, after the same forward steps
        limit = train.loss_nan_total_limit + 1 if train.loss_nan_total_limit > 0 else None
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


def _trackers(value, where="train.log_with"):
    """log_with: a name or a list (GigaTrain hands it to Accelerate) -> a list of the trackers to open."""
    import importlib.util
    names = [value] if isinstance(value, str) else list(value)
    out = []
    for name in names:
        if not isinstance(name, str):
            raise ConfigError(f"{where}: expected tracker names, got {name!r}")
        name = name.strip().lower()
        if name == "all":  # Accelerate: every tracker that is installed
            wanted = ["tensorboard", "jsonl"] + (["wandb"] if importlib.util.find_spec("wandb") else [])
        elif name in ("none", "no", ""):
            wanted = []
        elif name == "wandb" and not importlib.util.find_spec("wandb"):
            raise ConfigError(f"{where}: 'wandb' needs the wandb package: pip install 'giga-train[wandb]'"
                              " (WANDB_MODE=offline writes the run under logging_dir without an account)")
        elif name in LOG_TRACKERS:
            wanted = [name]
        else:
            raise ConfigError(f"{where}: {name!r} is not supported (choose from tensorboard, jsonl, wandb,"
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


EARLY_STOPPING_KEYS = ("metric", "mode", "patience", "min_delta")


def _check_early_stopping(config):
    unknown = sorted(set(config) - set(EARLY_STOPPING_KEYS))
    if unknown:
        return f"unknown key '{unknown[0]}'{did_you_mean(unknown[0], EARLY_STOPPING_KEYS)}"
    problem = _check_best(dict(metric=config.get("metric"), mode=config.get("mode", "min")))
    if problem:
        return problem
    patience, delta = config.get("patience", 3), config.get("min_delta", 0.0)
    if not isinstance(patience, int) or isinstance(patience, bool) or patience < 1:
        return f"patience: validations without improvement before stopping, an int >= 1; got {patience!r}"
    if not isinstance(delta, numbers.Real) or isinstance(delta, bool) or delta < 0:
        return f"min_delta: the least change that counts as an improvement, a number >= 0; got {delta!r}"
    return None


def _check_checkpointing(value):
    if value not in CHECKPOINTING_VALUES:
        return f"{value!r} is not one of {', '.join(map(repr, CHECKPOINTING_VALUES))}"
    return None


def _check_budget(value):
    try:
        memory_budget_bytes(value, None)
    except ValueError as e:
        return str(e)
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


def _check_test(test, project_dir, train_log_with=()):
    test.logging_dir = resolve_logging_dir(project_dir, test.logging_dir)
    # not given: the train section's trackers (a list once checked, so a second check keeps it)
    test.log_with = list(train_log_with) if test.log_with is None else _trackers(test.log_with, "test.log_with")
