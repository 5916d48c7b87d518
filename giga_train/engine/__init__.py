"""Importing this package registers every strategy in STRATEGIES (one file each)."""
from .protocol import StepResult, Strategy
from .ddp import DDPStrategy
from .deepspeed import DeepSpeedStrategy
from .fsdp import fsdp_strategy
from .fsdp1 import FSDP1Strategy
from .fsdp2 import FSDP2Strategy
from .single import SingleProcessStrategy



def strategy_class(launch):
    """The Strategy class that runs a validated `launch` section (FSDP: by fsdp_config.fsdp_version)."""
    from ..registry import STRATEGIES
    if launch.distributed_type == "FSDP":
        return FSDP1Strategy if launch.fsdp_config.fsdp_version == 1 else FSDP2Strategy
    return STRATEGIES.get(launch.distributed_type)


__all__ = ["strategy_class", "StepResult", "Strategy", "SingleProcessStrategy", "DDPStrategy", "FSDP1Strategy",
           "FSDP2Strategy", "DeepSpeedStrategy", "fsdp_strategy"]
