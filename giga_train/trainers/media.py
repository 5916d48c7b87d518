"""The validation-time sampling hook (sample_step; log_image and the others are media_log.py's). Sampling runs
on every rank (a sharded engine gathers weights in each forward: a main-rank-only forward would wait for the
others forever); the main rank's samples are logged."""
import torch

from ..data.loader import to_device
from ..errors import ConfigError
from .media_log import log_media
from .validation import ema_weights


def uses_sampling(trainer):
    return not getattr(type(trainer).sample_step, "default_hook", False)


def sample(trainer, validator, on_ema):
    """trainer.sample_step on this rank's first validation batch, every rank, without gradients, in eval mode,
    on the EMA weights when `on_ema`, with the same noise at every validation (torch seeded by train.seed,
    the training's random numbers restored afterwards); the main rank logs what it returns as samples/<name>."""
    if validator is None or not uses_sampling(trainer):
        return
    model, training = trainer.model, trainer.model.training
    batch = to_device(next(iter(validator.loader)), trainer.device)
    devices = [trainer.device] if trainer.device.type == "cuda" else []
    model.eval()
    try:
        with torch.random.fork_rng(devices), torch.no_grad(), ema_weights(trainer.ema if on_ema else None):
            torch.manual_seed(trainer.train_config.seed or 0)
            with trainer.strategy.autocast():
                out = trainer.sample_step(batch)
    finally:
        model.train(training)
    if out is None:
        return
    if not isinstance(out, dict):
        raise ConfigError(f"sample_step: return a dict of name -> image (CHW/HWC, PIL) or video (T,C,H,W / T,H,W,C),"
                          f" or None; got {type(out).__name__}")
    for name, value in out.items():
        video = isinstance(value, (list, tuple)) or getattr(value, "ndim", 0) == 4
        log_media(trainer, "video" if video else "image", f"samples/{name}", value)
