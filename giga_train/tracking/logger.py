"""What the main process tells the user: a progress bar, a text log, TensorBoard scalars."""
import logging
import os
import sys
import time

from tqdm import tqdm


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


def trackers(log_with):
    """GigaTrain's log_with (a name, a list of names, or None) as a set of tracker names."""
    names = [log_with] if isinstance(log_with, str) else list(log_with or [])
    names = {n.lower() for n in names} - {"none"}
    return {"tensorboard", "wandb"} if "all" in names else names


class MetricLogger:
    """Scalars every log_interval: the text log, the progress bar, and the trackers `log_with` names
    (TensorBoard, Weights & Biases), on the main rank."""

    def __init__(self, log_dir, log_with, is_main, start_step, max_steps, samples_per_step, show_bar=True,
                 run_name=None, config=None):
        self.is_main, self.samples_per_step = is_main, samples_per_step
        self.writer = self.wandb = None
        names = trackers(log_with) if is_main else set()
        if "tensorboard" in names:
            from torch.utils.tensorboard import SummaryWriter
            # purge_step hides events a crashed run wrote past the step we resume from.
            self.writer = SummaryWriter(log_dir, purge_step=start_step + 1 if start_step else None)
        if "wandb" in names:
            try:
                import wandb
            except ImportError:
                from ..errors import ConfigError
                raise ConfigError("train.log_with: 'wandb' needs the wandb package (pip install wandb);"
                                  " WANDB_MODE=offline writes the run locally") from None
            self.wandb = wandb.init(project=run_name, dir=log_dir, config=config, resume="allow")
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
        scalars = {**scalars, "step_time": step_time, "samples_per_sec": self.samples_per_step / step_time}
        if not self.is_main:
            return scalars
        tags = {name: name if "/" in name else f"train/{name}" for name in scalars}  # 'val/loss' stays itself
        if self.writer is not None:
            for name, value in scalars.items():
                self.writer.add_scalar(tags[name], value, step)
        if self.wandb is not None:
            self.wandb.log({tags[name]: value for name, value in scalars.items()}, step=step)
        parts = " | ".join(f"{k} {_fmt(v)}" for k, v in scalars.items())
        logging.getLogger("giga_train.metrics").info("step %d | %s", step, parts)
        if self.bar is not None:
            self.bar.set_postfix(bar_postfix(scalars), refresh=True)
        return scalars

    def advance(self, step):
        if self.bar is not None:
            self.bar.update(step - self.bar.n)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def bar_postfix(scalars):
    """The progress bar's numbers: the total loss (of named losses too), and the validation loss when
    there is one; nothing for a window whose every step was skipped, rather than 'nan'."""
    shown = {"loss": scalars.get("total_loss"), "val_loss": scalars.get("val/loss", scalars.get("val/total_loss"))}
    return {name: f"{value:.4f}" for name, value in shown.items() if value is not None}


def _fmt(value):
    return f"{value:.4g}" if isinstance(value, float) else str(value)
