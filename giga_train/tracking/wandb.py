"""Weights & Biases (the optional `wandb` extra; the schema refuses log_with='wandb' without it).
WANDB_MODE=offline writes the run under {logging_dir}/wandb for a later `wandb sync`."""
import os

from .base import Tracker, tag, tag_group


class WandbTracker(Tracker):
    def __init__(self, log_dir, run_name, config):
        import wandb
        os.makedirs(log_dir, exist_ok=True)
        # GigaTrain (Accelerate's init_trackers) names the project after basename(project_dir). The config
        # goes with init: it is then in the run's first record (a later config.update is written lazily).
        self.run = wandb.init(project=run_name, dir=log_dir, config=config)
        self.group = tag_group(config)

    def log(self, step, scalars):
        self.run.log({tag(name, self.group): value for name, value in scalars.items()}, step=step)

    def close(self):
        self.run.finish()
