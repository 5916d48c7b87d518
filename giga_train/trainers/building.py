"""The Trainer's constructor keywords, what its building hooks do by default (get_models' one module,
get_optimizers, get_schedulers), as functions of what they are given, the seeding of every rank, and the
engine and parts its prepare builds."""

import torch

from ..checkpoint.checkpointer import Checkpointer
from ..compat.utils import as_list
from ..engine import strategy_class
from ..engine.activation_checkpointing import apply_activation_checkpointing
from ..engine.fp8 import convert_to_float8
from ..engine.meta_start import rank0_loading
from ..engine.parallelize import parallelize
from ..errors import ConfigError
from ..optimizers import build_optimizer
from ..schedulers import SCHEDULERS
from .activation_budget import checkpointed_class_names
from .checkpointing import TrainerCheckpoints
from .nan_guard import NanGuard, SchedulerRewind
from .random_streams import seed_everything  # noqa: F401  (the Trainer seeds through it)
from .train_data import train_loaders, train_stream  # noqa: F401  (the Trainer builds its data through them)

# GigaTrain's named Trainer arguments; every other key of the `train` section is in self.kwargs.
TRAINER_KEYWORDS = (
    "max_epochs", "max_steps", "gradient_accumulation_steps", "mixed_precision", "dynamo_config", "ddp_config",
    "fp8_config", "data_parallel_size", "log_with", "log_interval", "log_cpu_memory", "checkpoint_interval",
    "checkpoint_total_limit", "checkpoint_keeps", "checkpoint_save_optimizer", "checkpoint_safe_serialization",
    "checkpoint_strict", "activation_checkpointing", "activation_class_names", "with_ema", "allow_tf32", "seed",
    "logging_dir")


def train_prepare_arguments(config):
    """Trainer.prepare's arguments from the validated config: the training data, the models to train
    (models.train, or the models section), the optimizers' and schedulers' configs."""
    models = config.models
    return dict(dataloaders=config.dataloaders.train, models=models.train if "train" in models else models,
                optimizers=config.optimizers, schedulers=config.schedulers)


def allow_tf32(train):
    """train.allow_tf32 (default True) on a GPU: TF32 matmuls and convolutions."""
    if train.get("allow_tf32", True) and torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True


def the_one_model(models):
    """What get_models returned, as the one module giga-train trains (a ConfigError for several)."""
    models = as_list(models)
    if len(models) != 1:
        raise ConfigError(f"get_models returned {len(models)} models: giga-train trains one module;"
                          " put several in a giga_train.ModuleDict (GigaTrain's checkpoints also hold one)")
    return models[0]


def checkpoint_blocks(trainer, models):
    """apply_activation_checkpointing's default: with train.activation_checkpointing, each module of a class
    in train.activation_class_names recomputes its activations in backward (under "auto": the blocks the
    memory budget needs; "selective": keeping the matmul and attention outputs)."""
    train = trainer.train_config
    if train.activation_checkpointing and train.activation_class_names:
        for model in models:
            apply_activation_checkpointing(model, checkpointed_class_names(trainer, model),
                                           selective=train.activation_checkpointing == "selective")


def float8_linears(trainer, models):
    """apply_fp8's default: with mixed_precision='fp8', the models' linears in float8 (train.fp8_config)."""
    if trainer.mixed_precision == "fp8":
        for model in models:
            convert_to_float8(model, trainer.train_config.fp8_config,
                              fsdp2=trainer.strategy.gathers_float8_weights())


def build_optimizers(configs, models, trainable):
    """One optimizer over all `models`, or one per model (GigaTrain's rule), from config dicts (an optimizer
    object is kept as it is) over each model's `trainable(model)` parameters."""
    configs = as_list(configs)
    if len(configs) not in (1, len(models)):
        raise ConfigError(f"optimizers: {len(configs)} configs for {len(models)} models (give one, or one per model)")
    built = []
    for i, cfg in enumerate(configs):
        if not isinstance(cfg, dict):
            built.append(cfg)  # an optimizer object the config or an override already built
            continue
        over = models if len(configs) == 1 else [models[i]]
        built.append(build_optimizer(cfg, [p for m in over for p in trainable(m)]))
    return built


def build_schedulers(configs, optimizers, **extras):
    """One scheduler per optimizer, from config dicts (given `extras`, epoch_size, max_epochs and max_steps,
    when the scheduler takes them); one config serves every optimizer."""
    configs = as_list(configs)
    if len(configs) == 1 and len(optimizers) > 1:
        configs = configs * len(optimizers)
    if len(configs) != len(optimizers):
        raise ConfigError(f"schedulers: {len(configs)} configs for {len(optimizers)} optimizers")
    return [SCHEDULERS.build(cfg, optimizer, **extras) if isinstance(cfg, dict) else cfg
            for cfg, optimizer in zip(configs, optimizers)]


def build_strategy(trainer):
    """The engine of the config's launch section (it opens the process group)."""
    launch = trainer.config.launch
    return strategy_class(launch)(trainer.env, launch, trainer.train_config, settings=trainer.config.engine_settings,
                                  micro_batch_size=trainer.config.dataloaders.train.batch_size_per_gpu)


def parallelize_model(trainer, make_optimizers, init_weights=None):
    """The engine's parallelize of the trainer's model, through its apply_activation_checkpointing and
    apply_fp8 hooks; `init_weights`: a project's own (None: the default); the engine's optimizer (one, or
    an OptimizerGroup) is the strategy's."""
    train, launch = trainer.train_config, trainer.config.launch
    model, _ = parallelize(trainer.models[0], trainer.strategy, train, launch.fsdp_config, make_optimizers,
                           checkpoint=lambda model: trainer.apply_activation_checkpointing([model]),
                           float8=lambda model: trainer.apply_fp8([model]), init_weights=init_weights,
                           from_rank0=rank0_loading(launch))
    return model


def build_parts(trainer, stream):
    """Once the engine, the optimizers, the EMA and the schedulers are there: the Checkpointer, the
    checkpointing part over it (reading and writing `stream`'s position), and the NaN guard."""
    train = trainer.train_config
    checkpoints = Checkpointer(trainer.strategy, trainer.model_dir, train, trainer.ema,
                               model_name=getattr(trainer, "model_name", "model"),  # GigaTrain's attribute
                               rank_state=stream if getattr(stream, "per_rank_state", False) else None)
    checkpointing = TrainerCheckpoints(trainer, checkpoints, stream)
    max_nan = train.max_nan_steps if train.max_nan_steps is not None else float("inf")  # None: never stop
    nan_guard = NanGuard(train.nan_policy, max_nan, trainer.is_main_process, checkpoints.latest_finite,
                         rewind=SchedulerRewind(trainer.schedulers, trainer.optimizers),
                         max_overflow=train.max_overflow_steps or float("inf"))
    return checkpoints, checkpointing, nan_guard
