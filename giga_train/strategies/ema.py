"""GigaTrain's import path for EMAModel and save_ema."""
from ..compat.ema_model import EMAModel, save_ema

__all__ = ["EMAModel", "save_ema"]
