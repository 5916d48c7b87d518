"""GigaTrain's schedulers (values per optimizer step, wrapped in LambdaLR by build_scheduler)."""
from .build import SCHEDULERS, build_scheduler
from .schedulers import (BaseScheduler, ConstantScheduler, CosineScheduler, CycleScheduler, FuncScheduler,
                         LinearScheduler, PolyScheduler, StepScheduler, WarmupCosineScheduler, WarmupLinearScheduler)

__all__ = ["SCHEDULERS", "build_scheduler", "BaseScheduler", "ConstantScheduler", "CosineScheduler",
           "CycleScheduler", "FuncScheduler", "LinearScheduler", "PolyScheduler", "StepScheduler",
           "WarmupCosineScheduler", "WarmupLinearScheduler"]
