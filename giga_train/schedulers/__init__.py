from .schedulers import ConstantScheduler, WarmupCosineScheduler, WarmupLinearScheduler

__all__ = ["ConstantScheduler", "WarmupCosineScheduler", "WarmupLinearScheduler"]
