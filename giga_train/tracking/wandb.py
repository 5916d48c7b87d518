"""Weights & Biases (the optional `wandb` extra; the schema refuses log_with='wandb' without it).
WANDB_MODE=offline writes the run under {logging_dir}/wandb for a later `wandb sync`."""
import os

from .base import Tracker


class WandbTracker(Tracker):
    def __init__(self, log_dir, run_name):
        import wandb
        os.makedirs(log_dir, exist_ok=True)
        # GigaTrain (Accelerate's init_trackers) names the project after basename(project_dir).
        self.run = wandb.init(project=run_name, dir=log_dir)

    def log_config(self, config, hparams):
        self.run.config.update(config, allow_val_change=True)

    def log(self, step, scalars):
        self.run.log({f"train/{name}": value for name, value in scalars.items()}, step=step)

    def close(self):
        self.run.finish()
