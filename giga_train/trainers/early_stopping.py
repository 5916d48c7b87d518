"""train.early_stopping=dict(metric='val/loss', mode='min', patience=3, min_delta=0.0): after each validation,
the run stops once `metric` has not improved on its best by more than `min_delta` for `patience` validations
in a row. Decided from the validation results, which are the same on every rank, so every rank stops at the
same step; the checkpoint of that step is written and kept out of the rolling limit. Its state is in the
trainer's (training_state.pt): a resumed run that had stopped stops again at once, unless the config's
patience was raised above the validations counted (then it goes on counting)."""
import logging
import math

from ..errors import ConfigError

log = logging.getLogger("giga_train")

class EarlyStopping:
    def __init__(self, config, folders):
        """`folders`: the run's CheckpointManager (the stopping step's checkpoint is protected there)."""
        self.metric, self.mode = config["metric"], config.get("mode", "min")
        self.patience, self.min_delta = config.get("patience", 3), float(config.get("min_delta", 0.0))
        self.folders = folders
        self.best = self.best_step = None
        self.bad = 0  # validations in a row without an improvement
        self.stopped_at = None  # the step the run stopped at
        self.former_stops = set()  # steps where a resumed run had stopped (patience raised since): kept too

    def update(self, step, results):
        """After a validation at `step`: True when the run stops here (one log line says why)."""
        if self.metric not in results:
            raise ConfigError(f"train.early_stopping.metric: {self.metric!r} is not among the validation results"
                              f" ({', '.join(sorted(results)) or 'none'})")
        value = results[self.metric]
        if self._improves(value):
            self.best, self.best_step, self.bad = value, step, 0
            return False
        self.bad += 1
        if self.bad < self.patience:
            return False
        self.stopped_at = step
        self.folders.protect(step)
        log.info("early stopping at step %d: %s has not improved on %s (step %s) by more than %g for %d"
                 " validations (train.early_stopping.patience=%d)", step, self.metric, self.best, self.best_step,
                 self.min_delta, self.bad, self.patience)
        return True

    def _improves(self, value):
        if not math.isfinite(value):
            return False  # a NaN or infinite validation counts as no improvement
        if self.best is None:
            return True
        return value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta

    def stopped(self, step):
        """Whether the run has stopped early at `step` (this run, or the one resumed)."""
        return self.stopped_at is not None and self.stopped_at == step

    # -- in the trainer's state (training_state.pt) ---------------------------------------------------
    def state_dict(self):
        return dict(metric=self.metric, best=self.best, best_step=self.best_step, bad=self.bad,
                    stopped_at=self.stopped_at, former_stops=sorted(self.former_stops))

    def load_state_dict(self, state):
        """A resumed run: the same metric goes on from its count; another metric starts afresh. A run that
        had stopped stays stopped unless the config's patience now exceeds the validations counted."""
        if not state or state.get("metric") != self.metric:
            return
        self.best, self.best_step, self.bad = state["best"], state["best_step"], state["bad"]
        stopped = state.get("stopped_at")
        self.former_stops = set(state.get("former_stops") or ())
        for step in self.former_stops:
            self.folders.protect(step)
        if stopped is not None:
            self.folders.protect(stopped)
            if self.bad >= self.patience:
                self.stopped_at = stopped
                log.info("this run stopped early at step %d (%s not improved for %d validations); nothing to"
                         " train: raise train.early_stopping.patience above %d to go on", stopped, self.metric,
                         self.bad, self.bad)
            else:
                self.former_stops.add(stopped)  # its checkpoint stays out of the rotation
                log.info("resumed a run that stopped early at step %d: patience is now %d (%d validations without"
                         " improvement counted), training goes on", stopped, self.patience, self.bad)
