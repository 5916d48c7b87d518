"""The interface every tracker of `train.log_with` implements."""


def tag(name):
    """A scalar's name in TensorBoard and wandb: the train/ group, unless the name has its own ('val/loss')."""
    return name if "/" in name else f"train/{name}"


class Tracker:
    """Opened with the run's resolved config (JSON-safe) and its hyper-parameters (a flat name -> scalar
    view of it), which it records once; then receives the scalars of every log step."""

    def log(self, step, scalars):
        """`scalars`: name -> float, already reduced over ranks."""

    def close(self):
        pass
