"""The trackers `train.log_with` names; only the main process opens any. Each is guarded: one that fails
is turned off with one warning line (guarded.py)."""
from .guarded import GuardedTracker


def build_trackers(names, log_dir, run_name, start_step, config, hparams):
    """The trackers for `names` (the schema's normalised log_with: 'tensorboard', 'jsonl', 'wandb'), each
    holding `config` (JSON-safe) and `hparams` from the start."""
    built = []
    for name in names:
        if name == "tensorboard":
            from .tensorboard import TensorBoardTracker
            built.append(GuardedTracker(name, lambda: TensorBoardTracker(log_dir, start_step, config, hparams)))
        elif name == "jsonl":
            from .jsonl import JsonlTracker
            built.append(GuardedTracker(name, lambda: JsonlTracker(log_dir, start_step, config, hparams)))
        elif name == "wandb":
            from .wandb import WandbTracker
            built.append(GuardedTracker(name, lambda: WandbTracker(log_dir, run_name, config)))
        else:
            raise ValueError(f"unknown tracker {name!r}")  # the schema refuses it first
    return [tracker for tracker in built if tracker.on]
