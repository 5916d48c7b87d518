"""Importing this package registers every strategy in STRATEGIES (one file each)."""
from .base import Strategy
from .ddp import DDPStrategy
from .deepspeed import DeepSpeedStrategy
from .fsdp import FSDPStrategy

__all__ = ["Strategy", "DDPStrategy", "DeepSpeedStrategy", "FSDPStrategy"]
