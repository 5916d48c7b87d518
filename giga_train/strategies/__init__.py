"""GigaTrain's import paths `giga_train.strategies[.ema|.activation_checkpointing]`, which projects use
(`from giga_train.strategies.ema import EMAModel`). The distributed strategies are giga_train.distributed."""
from ..compat.ema_model import EMAModel, save_ema
from ..compat.utils import module_auto_wrap_policy

__all__ = ["EMAModel", "save_ema", "module_auto_wrap_policy"]
