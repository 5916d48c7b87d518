"""giga-train: a config-driven trainer for large models on PyTorch (GigaTrain's public API, and ours)."""
from . import schedulers  # noqa: F401  (registers the schedulers)
from . import utils  # noqa: F401  (giga_train.utils, as GigaTrain has it)
from .config import Config, load_config
from .data import DefaultSampler
from .data.samplers import ParallelBatchSampler, build_sampler
from .launch.launcher import launch_from_config
from .engine.meta_start import load_safetensors_shards
from .engine.sequence_parallel import attention as sequence_parallel_attention
from .compat.ema_model import EMAModel
from .errors import ConfigError
from .module_dict import ModuleDict
from .optimizers import build_optimizer
from .registry import (DATASETS, OPTIMIZERS, SAMPLERS, TRANSFORMS, Registry, build_module, build_transform,
                       merge_params)
from .schedulers import SCHEDULERS, build_scheduler
from .compat.ssh import ssh_copy_id
from .trainers import Tester, Trainer
from .compat.utils import module_auto_wrap_policy, setup_environment

__version__ = "0.1.0"

__all__ = ["Trainer", "Tester", "ModuleDict", "launch_from_config", "load_config", "setup_environment", "Config",
           "ConfigError", "DefaultSampler", "TRANSFORMS", "DATASETS", "SAMPLERS", "OPTIMIZERS", "SCHEDULERS",
           "Registry", "build_module", "merge_params", "build_optimizer", "build_scheduler", "build_sampler",
           "build_transform", "ParallelBatchSampler", "EMAModel", "module_auto_wrap_policy", "ssh_copy_id",
           "utils", "load_safetensors_shards", "sequence_parallel_attention"]
