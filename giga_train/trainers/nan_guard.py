"""The NaN/Inf guard: decide whether a step is skipped, count skipped steps, warn, and stop with one line
when told to.

The decision (`verdict`) is one all-reduce of the loss's and the gradient norm's finiteness flags, so all
ranks agree. Flags decided on the device are settled here later without waiting, or with a wait where the
trainer needs the truth (a log line, a checkpoint, preemption, the end). fp16 loss-scaler skips count too
(docs/checkpoints.md, "Preemption and NaN steps", "A run that cannot make progress stops")."""
import collections
import logging

import torch

from ..engine.step import OVERFLOW, Verdict
from ..errors import TrainingStopped

log = logging.getLogger("giga_train")
MIN_LOSS_SCALE = 1.0  # DeepSpeed's default min_loss_scale: an overflow below it stops the run


def decide(strategy, loss, grad_norm):
    """The Verdict for a step whose summed loss on this rank is `loss`. Under fp16 only the loss counts:
    an inf gradient is the loss scaler's own, normal skip. On the device where the engine can skip there
    (no host read); else the flags are read on the host (one sync)."""
    scaled = strategy.precision.scaler is not None
    names, flags = strategy.finiteness_flags(loss=loss, grad_norm=None if scaled else grad_norm)
    if strategy.honours_found_inf():
        return Verdict(names, flags, found_inf=flags.amax())  # exactly 0.0 or 1.0: fused kernels skip on 1.0
    return Verdict(names, flags, nonfinite_names=tuple(n for n, bad in zip(names, flags.tolist()) if bad))


class StepFlags:
    """One step's verdict on its way to the host: what was non-finite, and whether the update was skipped."""

    def __init__(self, step, result):
        self.step = step
        self.on_device = result.found_inf is not None  # skipped (or not) by the optimizer, on the device
        self.skipped = result.skipped
        self.loss_scale = getattr(result, "loss_scale", None)  # the fp16 scaler's skip: the scale after it
        self.event = None
        if not self.on_device:
            self.names, self.values = result.nonfinite_names, [1.0] * len(result.nonfinite_names)
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

    def read(self):
        """The names that were non-finite on some rank (waits for the copy if it is still in flight)."""
        if self.event is not None:
            self.event.synchronize()
        values = self.values.tolist() if torch.is_tensor(self.values) else self.values
        bad = tuple(name for name, value in zip(self.names, values) if value)
        if self.on_device:
            self.skipped = bool(bad)
        return bad


class NanGuard:
    """`rewind`: the SchedulerRewind of the steps whose skip is decided on the device (None: no scheduler);
    `max_overflow`: fp16 scaler skips in a row before the run stops."""

    def __init__(self, policy, max_in_a_row, is_main, newest_checkpoint=lambda: None, rewind=None,
                 max_overflow=float("inf")):
        self.policy, self.max_in_a_row, self.is_main = policy, max_in_a_row, is_main
        self.newest_checkpoint = newest_checkpoint  # called only for a stop's message
        self.rewind = rewind
        self.max_overflow = max_overflow
        self.in_a_row = 0  # consecutive skipped steps
        self.overflow_in_a_row = 0  # consecutive steps the fp16 loss scaler skipped
        self.window = 0    # skipped since the last log line (the `nan_skipped` scalar)
        self.pending = collections.deque()  # StepFlags not settled yet, oldest first
        self.stopping = None  # a TrainingStopped found by a settle that must not raise on its own (see settle)

    @property
    def enabled(self):
        return self.policy != "off"

    def verdict(self, strategy, loss):
        """What strategy.step asks once the gradient norm is known (None: the guard is off)."""
        if not self.enabled:
            return None
        return lambda grad_norm: decide(strategy, loss, grad_norm)

    def before_scheduler_step(self, step, result):
        """Call before the scheduler steps for `step` (its StepResult `result`): a skip decided on the
        device is known later, when the scheduler step may have to be taken back."""
        if result.found_inf is not None and self.rewind is not None:
            self.rewind.remember(step)

    def record(self, step, result):
        if self.enabled or OVERFLOW in result.nonfinite_names:  # the scaler's skips count with the guard off too
            self.pending.append(StepFlags(step, result))

    def step_done(self, step, result):
        """After step `step` (its StepResult): record it, and settle the flags that have reached the host
        (never waits)."""
        self.record(step, result)
        self.settle(step)

    def agreed_preemption(self, preemption, env, step):
        """After each step, on every rank (a collective): whether a signal stops the run (PreemptionSignals),
        agreed with whether a settle on any rank found a stop; that stop raises here (TrainingStopped), the
        same on every rank."""
        preempted, stopping = preemption.agreed(env, self.stopping is not None)
        if stopping:
            self.settle(step, wait=True)
        return preempted

    def settle(self, now, wait=False):
        """Settle the pending steps in order: those whose flags have reached the host, or all (`wait`);
        a step skipped on the device takes its scheduler step back (SchedulerRewind). A stop found without
        `wait` is kept in `stopping` and raised by the next settle with `wait`: ranks settle at different
        moments, so the trainer first agrees with the others on a stop (and every rank then finds the same
        one); with `wait` every rank is at the same point."""
        if self.stopping is not None:
            if wait:
                raise self.stopping
            return
        while self.pending and (wait or self.pending[0].ready()):
            flags = self.pending.popleft()
            bad = flags.read()
            if self.rewind is not None:
                self.rewind.settled(flags)
            if not bad:
                self.in_a_row = self.overflow_in_a_row = 0
                continue
            if bad == (OVERFLOW,):
                error = self._count_overflow(flags.step, flags.loss_scale, now)
            else:
                error = self._count_bad_step(flags.step, bad, flags.skipped, now)
            if error is not None:
                if wait:
                    raise error
                self.stopping = error
                return

    def _count_bad_step(self, step, what, skipped, now):
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

    def _count_overflow(self, step, loss_scale, now):
        """A step the fp16 loss scaler skipped: counted (no warning), or the TrainingStopped to raise when
        the scale fell below MIN_LOSS_SCALE or train.max_overflow_steps were skipped in a row."""
        self.overflow_in_a_row += 1
        self.window += 1
        since = step - self.overflow_in_a_row + 1
        why = None
        if loss_scale is not None and loss_scale < MIN_LOSS_SCALE:
            why = f"the loss scale fell to {loss_scale:g}, below its floor {MIN_LOSS_SCALE:g}"
        elif self.overflow_in_a_row >= self.max_overflow:
            why = f"train.max_overflow_steps={self.max_overflow}"
        if why is None:
            log.debug("step %d: fp16 gradients overflowed; the loss scaler skipped the update", step)
            return None
        later = f" at step {now}" if now != step else ""
        return TrainingStopped(
            f"step {step}: fp16 gradients inf or nan in every step since step {since} ({self.overflow_in_a_row}"
            f" skipped, no update; {why}): nothing trains; stopped{later}, nothing saved; newest good"
            f" checkpoint: {self.newest_checkpoint() or 'none yet'}")

    def take_window(self):
        """The steps skipped since the last call, for the log line (None with the guard off); then 0."""
        if not self.enabled:
            return None
        count, self.window = self.window, 0
        return count


class SchedulerRewind:
    """The scheduler's side of a skip decided on the device: the loop steps the scheduler before the host
    knows whether the step was skipped; a step settled as skipped takes its scheduler step back."""

    def __init__(self, schedulers, optimizers):
        self.schedulers, self.optimizers = schedulers, optimizers
        self.before = {}  # step -> scheduler state before it, for steps whose skip is in flight

    def remember(self, step):
        """Call before the scheduler step of `step`, whose skip is decided on the device."""
        self.before[step] = self._state()

    def settled(self, flags):
        """A step whose skip was decided on the device is settled: if it was skipped, take back the
        scheduler step it made. The steps taken while its flag was in flight may have used a one-step-later
        lr (per skipped step among them); from here on the lr is the host path's."""
        if not flags.on_device:
            return
        before = self.before.pop(flags.step)
        if not flags.skipped:
            return
        self._set_state(before)
        for later in self.before:  # steps still in flight (in order): replay their scheduler steps
            self.before[later] = self._state()
            for scheduler in self.schedulers:
                scheduler.step()

    def _state(self):
        return ([scheduler.state_dict() for scheduler in self.schedulers],
                [group["lr"] for optimizer in self.optimizers for group in optimizer.param_groups])

    def _set_state(self, state):
        scheduler_states, lrs = state
        for scheduler, scheduler_state in zip(self.schedulers, scheduler_states):
            scheduler.load_state_dict(scheduler_state)
        for group, lr in zip([g for optimizer in self.optimizers for g in optimizer.param_groups], lrs):
            group["lr"] = lr
