"""Weights & Biases (the optional `wandb` extra; the schema refuses log_with='wandb' without it).
WANDB_MODE=offline writes the run under {logging_dir}/wandb for a later `wandb sync`."""
import os

from ..errors import ConfigError
from .base import Tracker, tag, tag_group
from .media import file_stem, gif_bytes


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
        self.group, self.log_dir = tag_group(config), log_dir

    def log(self, step, scalars):
        self.run.log({tag(name, self.group): value for name, value in scalars.items()}, step=step)

    def log_media(self, step, name, kind, data, fps=None):
        import wandb
        if kind == "image":
            value = wandb.Image(data)
        else:  # wandb.Video of raw frames needs moviepy; of a GIF file, nothing more
            folder = os.path.join(self.log_dir, "media", "wandb")
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, file_stem(name, step) + ".gif")
            with open(path, "wb") as f:
                f.write(gif_bytes(data, fps))
            value = wandb.Video(path, format="gif")
        self.run.log({name: value}, step=step)

    def close(self):
        self.run.finish()
