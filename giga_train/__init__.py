"""giga-train: a config-driven trainer for large models on PyTorch."""
from . import schedulers  # noqa: F401  (registers the schedulers)
from .config import Config, ConfigError, load_config
from .data import DefaultSampler
from .distributed import launch_from_config, setup_environment
from .module_dict import ModuleDict
from .registry import DATASETS, OPTIMIZERS, SAMPLERS, SCHEDULERS, TRANSFORMS
from .trainers import Trainer

__version__ = "0.1.0"

__all__ = ["Trainer", "ModuleDict", "launch_from_config", "load_config", "setup_environment", "Config",
           "ConfigError", "DefaultSampler", "TRANSFORMS", "DATASETS", "SAMPLERS", "OPTIMIZERS", "SCHEDULERS"]
