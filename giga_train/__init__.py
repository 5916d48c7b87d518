"""giga-train: a config-driven trainer for large models on PyTorch."""
from . import schedulers  # noqa: F401  (registers the schedulers)
from .config import Config, load_config
from .data import DefaultSampler
from .distributed import setup_environment
from .distributed.launch import launch_from_config
from .errors import ConfigError
from .module_dict import ModuleDict
from .registry import DATASETS, OPTIMIZERS, SAMPLERS, SCHEDULERS, TRANSFORMS
from .trainers import Trainer

__version__ = "0.1.0"

__all__ = ["Trainer", "ModuleDict", "launch_from_config", "load_config", "setup_environment", "Config",
           "ConfigError", "DefaultSampler", "TRANSFORMS", "DATASETS", "SAMPLERS", "OPTIMIZERS", "SCHEDULERS"]
