"""Importing this package registers every strategy in STRATEGIES (one file each)."""
from .protocol import StepResult, Strategy
from .ddp import DDPStrategy
from .deepspeed import DeepSpeedStrategy
from .fsdp import fsdp_strategy
from .fsdp1 import FSDP1Strategy
from .fsdp2 import FSDP2Strategy
from .single import SingleProcessStrategy

__all__ = ["StepResult", "Strategy", "SingleProcessStrategy", "DDPStrategy", "FSDP1Strategy", "FSDP2Strategy",
           "DeepSpeedStrategy", "fsdp_strategy"]
