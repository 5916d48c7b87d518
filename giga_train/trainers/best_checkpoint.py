"""train.checkpoint_best=dict(metric='val/loss', mode='min'): the checkpoint of the best validation so far
is kept out of the rolling limit (as a checkpoint_keeps step is) and named in `models/best.json`; the
one it replaces goes back into the rotation."""
import json
import math
import os

from ..checkpoint.manager import checkpoint_name, list_checkpoints
from ..errors import ConfigError

BEST_FILE = "best.json"


class BestCheckpoint:
    def __init__(self, config, folders, is_main):
        """`folders`: the run's CheckpointManager (the best's step is protected there: never rotated, whether
        the run counts in steps or epochs)."""
        self.metric, self.mode = config["metric"], config.get("mode", "min")
        self.folders, self.is_main = folders, is_main
        self.value = self.step = None
        self.due = None  # the step whose checkpoint must be written: it became the best
        self.released = set()  # former bests, back in the rotation

    def update(self, step, results):
        """After a validation at `step`: True when its `metric` beats the best so far (then that step's
        checkpoint is protected, and due to be written if the interval does not write it anyway)."""
        if self.metric not in results:
            raise ConfigError(f"train.checkpoint_best.metric: {self.metric!r} is not among the validation results"
                              f" ({', '.join(sorted(results)) or 'none'})")
        value = results[self.metric]
        if not math.isfinite(value):
            return False
        if self.value is not None and not (value < self.value if self.mode == "min" else value > self.value):
            return False
        if self.step is not None:
            self.folders.release(self.step)  # the former best rotates out like any other (but a keep)
            self.released.add(self.step)
        self.value, self.step, self.due = value, step, step
        self.folders.protect(step)
        return True

    def saved(self, step, epoch):
        """After each save (the checkpoint of `step` written, or being written in the background): record
        it as the best when it is, and delete the former bests the rolling limit no longer covers."""
        if self.is_main:
            self._prune()
        if self.due != step:
            return
        self.due = None
        if self.is_main:
            record = dict(metric=self.metric, mode=self.mode, value=self.value, step=step,
                          checkpoint=checkpoint_name(epoch, step))
            path = os.path.join(self.folders.models_dir, BEST_FILE)
            with open(path + ".tmp", "w") as f:
                json.dump(record, f, indent=2)
            os.replace(path + ".tmp", path)

    def _prune(self):
        """The rotation walks the run's lineage back from its newest checkpoint, and that walk stops at a
        checkpoint it deleted: a best kept past such a gap is out of its reach once released. Counted here
        as rotation counts: a released best outside the newest `total_limit` not kept goes."""
        limit = self.folders.total_limit
        if limit is None or not self.released:
            return
        found = list_checkpoints(self.folders.models_dir)
        rolling = [step for step, path in found if not self.folders.kept(path, step)]
        covered = set(rolling[-limit:])
        for step, path in found:
            if step in self.released and step not in covered and not self.folders.kept(path, step):
                self.folders._delete(path)  # the manager's delete: renamed aside first, never half a checkpoint
        self.released &= covered

    # -- in the trainer's state (training_state.pt): a resumed run knows the best so far ------------------
    def state_dict(self):
        return dict(metric=self.metric, value=self.value, step=self.step)

    def load_state_dict(self, state):
        if not state or state.get("metric") != self.metric or state.get("step") is None:
            return  # another metric was tracked: start afresh
        self.value, self.step = state["value"], state["step"]
        self.folders.protect(self.step)
