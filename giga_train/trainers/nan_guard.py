"""The NaN/Inf guard's bookkeeping: count skipped steps, warn, and stop with one line when told to.

Detection lives in Strategy.step (one all-reduce of the finiteness flags, so all ranks agree). Where the
optimizer skips on the device (found_inf) the flags reach the host later: each step's flags are copied
non_blocking into pinned memory behind a CUDA event, and settled here in step order once the event has
completed (a query, never a wait), or forcibly (a wait) where the trainer needs the truth: at a log line,
before a checkpoint, on preemption, at the end. On the CPU the flags are there at once. Where the host
read them itself (optimizers without found_inf, DeepSpeed) a step's record is settled as it comes."""
import collections
import logging

import torch

log = logging.getLogger("giga_train")


class TrainingStopped(RuntimeError):
    """A run stopped on purpose, with a one-line reason; the launcher reports it once and never retries."""


class StepFlags:
    """One step's verdict on its way to the host: what was non-finite, and whether the update was skipped."""

    def __init__(self, step, result):
        self.step = step
        self.on_device = result.found_inf is not None  # skipped (or not) by the optimizer, on the device
        self.skipped = result.skipped
        self.event = None
        if not self.on_device:
            self.names, self.values = result.nonfinite, [1.0] * len(result.nonfinite)
            return
        self.names, self.values = result.names, result.flags
        if result.flags.is_cuda:
            self.values = torch.empty(result.flags.shape, dtype=result.flags.dtype, pin_memory=True)
            self.values.copy_(result.flags, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()

    def ready(self):
        if self.event is not None and self.event.query():
            self.event = None  # arrived: nothing to wait for
        return self.event is None

    def nonfinite(self):
        """The names that were non-finite on some rank (waits for the copy if it is still in flight)."""
        if self.event is not None:
            self.event.synchronize()
        values = self.values.tolist() if torch.is_tensor(self.values) else self.values
        bad = tuple(name for name, value in zip(self.names, values) if value)
        if self.on_device:
            self.skipped = bool(bad)
        return bad


class NanGuard:
    def __init__(self, policy, max_in_a_row, is_main, newest_checkpoint=lambda: None):
        self.policy, self.max_in_a_row, self.is_main = policy, max_in_a_row, is_main
        self.newest_checkpoint = newest_checkpoint  # called only for a stop's message
        self.in_a_row = 0  # consecutive skipped steps
        self.window = 0    # skipped since the last log line (the `nan_skipped` scalar)
        self.pending = collections.deque()  # StepFlags not settled yet, oldest first
        self.stopping = None  # a TrainingStopped found by a settle that must not raise on its own (see settle)

    @property
    def enabled(self):
        return self.policy != "off"

    def record(self, step, result):
        if self.enabled:
            self.pending.append(StepFlags(step, result))

    def settle(self, now, wait=False, on_settled=None):
        """Settle the pending steps in order: those whose flags have reached the host, or all (`wait`).
        `on_settled(flags)` runs for each (the trainer rewinds the scheduler for a step skipped on the
        device). A stop found without `wait` is kept in `stopping` and raised by the next settle with
        `wait`: ranks settle at different moments, so the trainer first agrees with the others on a
        stop (and every rank then finds the same one); with `wait` every rank is at the same point."""
        if self.stopping is not None:
            if wait:
                raise self.stopping
            return
        while self.pending and (wait or self.pending[0].ready()):
            flags = self.pending.popleft()
            bad = flags.nonfinite()
            if on_settled is not None:
                on_settled(flags)
            if not bad:
                self.in_a_row = 0
                continue
            error = self.nonfinite(flags.step, bad, flags.skipped, now)
            if error is not None:
                if wait:
                    raise error
                self.stopping = error
                return

    def nonfinite(self, step, what, skipped, now):
        """A step whose loss or gradient norm was non-finite on some rank: warns and counts it, or returns
        the TrainingStopped to raise (before anything is saved, so the newest checkpoint is a good one)."""
        what = " and ".join(what)
        self.in_a_row += 1
        self.window += 1
        later = f" at step {now}" if now != step else ""
        keep = f"nothing saved; newest good checkpoint: {self.newest_checkpoint() or 'none yet'}"
        if not skipped:
            return TrainingStopped(f"step {step}: non-finite {what}, and the engine had already applied the update"
                                   f" (it skips only on non-finite gradients); stopped{later}, {keep}")
        if self.policy == "stop":
            return TrainingStopped(f"step {step}: non-finite {what} (train.nan_policy='stop'); stopped{later}, {keep}")
        if self.in_a_row >= self.max_in_a_row:
            return TrainingStopped(f"step {step}: non-finite {what} for {self.in_a_row} steps in a row"
                                   f" (train.max_nan_steps={self.max_in_a_row}); stopped{later}, {keep}")
        if self.is_main:
            log.warning("step %d: non-finite %s; skipped the update (%d in a row, train.max_nan_steps=%d)",
                        step, what, self.in_a_row, self.max_in_a_row)
        return None

    def take_window(self):
        count, self.window = self.window, 0
        return count
