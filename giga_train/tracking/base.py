"""The interface every tracker of `train.log_with` implements."""


def tag(name, group="train/"):
    """A scalar's name in TensorBoard and wandb: the train/ group, unless the name has its own ('val/loss');
    `group` '' (train.log_tags='gigatrain'): the bare name, GigaTrain's tag ('total_loss', 'mse')."""
    return name if "/" in name else f"{group}{name}"


def tag_group(config):
    """The group of ungrouped scalars the run's config asks for (train.log_tags)."""
    return "" if (config.get("train") or {}).get("log_tags") == "gigatrain" else "train/"


class Tracker:
    """Opened with the run's resolved config (JSON-safe) and its hyper-parameters (a flat name -> scalar
    view of it), which it records once; then receives the scalars of every log step."""

    def log(self, step, scalars):
        """`scalars`: name -> float, already reduced over ranks."""

    def log_media(self, step, name, kind, data, fps=None):
        """`kind` 'image' (`data` uint8 H,W,C) or 'video' (uint8 T,H,W,C at `fps`), from the main rank."""

    def close(self):
        pass
