"""The Trainer's evaluation part: the scalars log_metric adds (summed on the device, averaged at the next
log line), the validation during training (train.eval_interval over dataloaders.val, by the Validator) and
its results, waiting for the log line of their step; then the sampling hook (media.py). The Trainer's log_metric, metrics_into, validate and
validate_if_due delegate here."""
import contextlib

from ..errors import ConfigError
from ..tracking.metrics import MetricSums
from .media import sample
from .validation import Validator


class Evaluation:
    def __init__(self, device):
        self.logged = self.sink = MetricSums(device)  # log_metric's, until the next log line
        self.validator = None  # made by prepare when the config validates
        self.results = None  # the validation of this step, logged with its scalars

    def prepare(self, trainer):
        """The validator with train.eval_interval and dataloaders.val; a line when only one is given."""
        every, val = trainer.train_config.eval_interval, trainer.config.dataloaders.get("val")
        if every and val is not None:
            self.validator = Validator(val, trainer.env, trainer.data_rank_and_world)
            self.validator.max_batches = trainer.train_config.max_steps if trainer.train_config.get("dry_run") else None
        elif every:  # a GigaTrain fork's own key too: its trainer may validate by self.kwargs
            trainer.print("train.eval_interval without dataloaders.val: giga-train validates nothing")
        elif val is not None:
            trainer.print("dataloaders.val is not used: set train.eval_interval to validate every N steps")

    def add(self, name, value):
        self.sink.add(name, value)

    @contextlib.contextmanager
    def into(self, sums):
        """While inside: add() adds to `sums` (a MetricSums) instead of the training log's."""
        saved, self.sink = self.sink, sums
        try:
            yield sums
        finally:
            self.sink = saved

    def validate(self, trainer):
        if self.validator is None:
            raise ConfigError("validate(): set train.eval_interval and dataloaders.val")
        results = self.validator.run(trainer, on_ema=trainer.train_config.eval_ema)
        sample(trainer, self.validator, on_ema=trainer.train_config.eval_ema)  # the hook's media, when defined
        return results

    def due(self, step, every, last_step):
        """Whether step `step` validates: every `every` steps and at the last."""
        return self.validator is not None and not (step % every and step != last_step)

    def keep(self, results):
        """This step's validation `results`, kept for its log line; returned."""
        self.results = results
        return results

    def take_results(self):
        """This step's validation results (None when it did not validate); then none."""
        results, self.results = self.results, None
        return results
