from .build import build_optimizer
from .came_8bit import CAME8Bit
from .fused_adam import FusedAdam

__all__ = ["build_optimizer", "CAME8Bit", "FusedAdam"]
