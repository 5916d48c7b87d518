"""Weights & Biases (the optional `wandb` extra; the schema refuses log_with='wandb' without it).
WANDB_MODE=offline writes the run under {logging_dir}/wandb for a later `wandb sync`."""
import os

from ..errors import ConfigError
from .base import Tracker, tag, tag_group


class WandbTracker(Tracker):
    def __init__(self, log_dir, run_name, config):
        import wandb
        os.makedirs(log_dir, exist_ok=True)
        # GigaTrain (Accelerate's init_trackers) names the project after basename(project_dir). The config
        # goes with init: it is then in the run's first record (a later config.update is written lazily).
        try:
            self.run = wandb.init(project=run_name, dir=log_dir, config=config)
        except wandb.errors.UsageError as e:
            if "api key" not in str(e).lower():
                raise
            raise ConfigError("train.log_with: 'wandb' online needs a W&B API key: set WANDB_API_KEY (or run"
                              " `wandb login`), or WANDB_MODE=offline to write the run for a later `wandb sync`"
                              f" (wandb: {str(e).strip().splitlines()[0]})") from None
        self.group = tag_group(config)

    def log(self, step, scalars):
        self.run.log({tag(name, self.group): value for name, value in scalars.items()}, step=step)

    def close(self):
        self.run.finish()
