"""The NaN/Inf guard's bookkeeping: count skipped steps, warn, and stop with one line when told to.

Detection lives in Strategy.step (one all-reduce of the finiteness flags, so all ranks agree); this
decides what the trainer does with a non-finite step."""
import logging

log = logging.getLogger("giga_train")


class TrainingStopped(RuntimeError):
    """A run stopped on purpose, with a one-line reason; the launcher reports it once and never retries."""


class NanGuard:
    def __init__(self, policy, max_in_a_row, is_main):
        self.policy, self.max_in_a_row, self.is_main = policy, max_in_a_row, is_main
        self.in_a_row = 0  # consecutive skipped steps
        self.window = 0    # skipped since the last log line (the `nan_skipped` scalar)

    @property
    def enabled(self):
        return self.policy != "off"

    def finite(self):
        self.in_a_row = 0

    def nonfinite(self, step, result, newest_checkpoint):
        """A step whose loss or gradient norm was non-finite on some rank. Warns and counts it, or raises
        TrainingStopped (before anything is saved, so the newest checkpoint stays the newest good one)."""
        what = " and ".join(result.nonfinite)
        self.in_a_row += 1
        self.window += 1
        keep = f"nothing saved; newest good checkpoint: {newest_checkpoint or 'none yet'}"
        if not result.skipped:
            raise TrainingStopped(f"step {step}: non-finite {what}, and the engine had already applied the update"
                                  f" (it skips only on non-finite gradients); stopped, {keep}")
        if self.policy == "stop":
            raise TrainingStopped(f"step {step}: non-finite {what} (train.nan_policy='stop'); stopped, {keep}")
        if self.in_a_row >= self.max_in_a_row:
            raise TrainingStopped(f"step {step}: non-finite {what} for {self.in_a_row} steps in a row"
                                  f" (train.max_nan_steps={self.max_in_a_row}); stopped, {keep}")
        if self.is_main:
            log.warning("step %d: non-finite %s; skipped the update (%d in a row, train.max_nan_steps=%d)",
                        step, what, self.in_a_row, self.max_in_a_row)

    def take_window(self):
        count, self.window = self.window, 0
        return count
