"""What the main process tells the user: a progress bar, a text log, the trackers' scalars."""
import logging
import os
import sys
import time

from tqdm import tqdm

from .run_config import json_safe
from .trackers import build_trackers


def text_logger(log_dir, is_main, file_name="train.log"):
    """`giga_train` logger: console and `{log_dir}/{file_name}` on the main rank, silent elsewhere."""
    logger = logging.getLogger("giga_train")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    logger.setLevel(logging.INFO if is_main else logging.WARNING)
    logger.propagate = False
    if is_main:
        os.makedirs(log_dir, exist_ok=True)
        fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S")
        file_handler = logging.FileHandler(os.path.join(log_dir, file_name))
        file_handler.setFormatter(fmt)
        logger.addHandler(file_handler)
        console = _TqdmHandler()
        console.setFormatter(logging.Formatter("[giga-train] %(message)s"))
        logger.addHandler(console)
    return logger


class _TqdmHandler(logging.StreamHandler):
    """Console lines that do not break the progress bar."""

    def emit(self, record):
        tqdm.write(self.format(record), file=sys.stderr)


class MetricLogger:
    """Scalars every log_interval: the text log, the progress bar, and the trackers `log_with` names
    (tensorboard, jsonl, wandb), on the main rank; the resolved config and its hyper-parameters once.
    `perf` (a PerfMeter) adds memory, throughput and MFU scalars."""

    def __init__(self, log_dir, log_with, is_main, start_step, max_steps, samples_per_step, show_bar=True,
                 run_name=None, config=None, hparams=None, perf=None):
        self.is_main, self.samples_per_step, self.perf = is_main, samples_per_step, perf
        self.trackers = build_trackers(log_with, log_dir, run_name, start_step, json_safe(config or {}),
                                       hparams or {}) if is_main else []
        self.bar = None
        if is_main and show_bar:
            self.bar = tqdm(total=max_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True,
                            mininterval=0.5 if sys.stderr.isatty() else 10.0, file=sys.stderr)
        self._last_time, self._last_step = time.perf_counter(), start_step

    def log_step(self, step, scalars):
        """`scalars`: name -> float, already reduced over ranks. Adds step time and throughput."""
        now = time.perf_counter()
        steps = max(step - self._last_step, 1)
        step_time = (now - self._last_time) / steps
        self._last_time, self._last_step = now, step
        samples_per_sec = self.samples_per_step / step_time
        scalars = {**scalars, "step_time": step_time, "samples_per_sec": samples_per_sec,
                   **(self.perf.scalars(samples_per_sec) if self.perf is not None else {})}
        if not self.is_main:
            return scalars
        for tracker in self.trackers:
            tracker.log(step, scalars)
        parts = " | ".join(f"{k} {_fmt(v)}" for k, v in scalars.items())
        logging.getLogger("giga_train.metrics").info("step %d | %s", step, parts)
        if self.bar is not None:
            self.bar.set_postfix(bar_postfix(scalars), refresh=True)
        return scalars

    def log_media(self, step, name, kind, data, fps=None):
        """An image or video (media.py's uint8 arrays) to every tracker; the main rank's call writes, others none."""
        if self.is_main:
            for tracker in self.trackers:
                tracker.log_media(step, name, kind, data, fps)

    def advance(self, step):
        if self.bar is not None:
            self.bar.update(step - self.bar.n)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        for tracker in self.trackers:
            tracker.close()


def bar_postfix(scalars):
    """The progress bar's numbers: the total loss (of named losses too), and the validation loss when
    there is one; nothing for a window whose every step was skipped, rather than 'nan'."""
    shown = {"loss": scalars.get("total_loss"), "val_loss": scalars.get("val/loss", scalars.get("val/total_loss"))}
    return {name: f"{value:.4f}" for name, value in shown.items() if value is not None}


def _fmt(value):
    return f"{value:.4g}" if isinstance(value, float) else str(value)
