"""The Trainer's log_image, log_video and log_figure, and the validation-time sampling hook (sample_step).
Logging is the main rank's alone and holds no collective: a call on every rank writes once, a call on the
main rank only returns at once. Sampling runs on every rank (a sharded engine gathers weights in each
forward: a main-rank-only forward would wait for the others forever); the main rank's samples are logged."""
import logging

import torch

from ..data.loader import to_device
from ..errors import ConfigError
from ..tracking.media import as_image, as_video
from .validation import ema_weights

log = logging.getLogger("giga_train")
SAMPLE_FPS = 8  # of a video sample_step returns (log_video inside sample_step for another rate)


def log_media(trainer, kind, name, data, fps=None, step=None):
    """`kind` 'image' or 'video'; at `step` (None: cur_step, the step being computed or the last done), main rank only."""
    if not isinstance(name, str):
        raise TypeError(f"log_{kind}: the name must be a string, got {name!r}")
    if not trainer.is_main_process:
        return
    run_log = getattr(trainer, "run_log", None)
    if run_log is None:
        if not getattr(trainer, "_media_warned", False):
            log.warning("log_%s(%r): no trackers outside train(); nothing logged", kind, name)
            trainer._media_warned = True
        return
    array = as_image(data, f"log_{kind}({name!r})") if kind == "image" else as_video(data, f"log_video({name!r})")
    run_log.metrics.log_media(trainer.cur_step if step is None else step, name, kind, array, fps or SAMPLE_FPS)


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
