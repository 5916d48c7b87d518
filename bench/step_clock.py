"""One way to time training steps for both sides of bench/wan.py (our Trainer and the real GigaTrain's): a
timestamp at each step's end after the device has finished the step's work, and the mean step over the
second half. Both trainers call save_checkpoint_step once per optimizer step, which is where it is read.
On CUDA it also splits the peak memory by phase (start, forward, backward, optimizer step), so a difference
in peaks between the two sides points at where it comes from."""
import time

import torch


class StepClock:
    def __init__(self, device):
        self.device = torch.device(device)
        self.ends = [time.perf_counter()]
        self.phase_peaks = {}  # phase -> the highest torch.cuda.max_memory_allocated over steps, GiB
        self.allocated_after_step = None

    def mark(self, phase):
        """The peak since the last mark belongs to `phase` (CUDA only)."""
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) / 2**30
            self.phase_peaks[phase] = max(peak, self.phase_peaks.get(phase, 0.0))
            torch.cuda.reset_peak_memory_stats(self.device)

    def marking(self, phase, function):
        """`function` that marks `phase` when it returns."""
        def marked(*args, **kwargs):
            result = function(*args, **kwargs)
            self.mark(phase)
            return result
        return marked

    def tick(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mark("step")  # what follows the last mark: the optimizer step (with clipping)
            self.allocated_after_step = torch.cuda.memory_allocated(self.device) / 2**30
        self.ends.append(time.perf_counter())

    def memory_row(self):
        """The row's memory fields beyond the overall peak (empty on CPU)."""
        if not self.phase_peaks:
            return {}
        return dict(phase_peaks_gib=self.phase_peaks, allocated_after_step_gib=self.allocated_after_step)

    def mean_step_s(self):
        """Mean seconds per step over the second half of the steps (the first half warms up)."""
        steps = [b - a for a, b in zip(self.ends, self.ends[1:])]
        timed = steps[len(steps) // 2:]
        return sum(timed) / len(timed) if timed else float("nan")


def peak_memory_gib(device, clock=None):
    """torch.cuda.max_memory_allocated on CUDA (the highest of the clock's phases when it reset it); the
    process's peak RSS on CPU."""
    if torch.device(device).type == "cuda":
        return max([torch.cuda.max_memory_allocated() / 2**30, *(clock.phase_peaks.values() if clock else ())])
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def memory_fields(device, clock=None):
    """A row's memory: the peak, on CUDA the allocator's reserved peak, and the clock's split when there is one."""
    fields = dict(peak_gib=peak_memory_gib(device, clock))
    if torch.device(device).type == "cuda":
        fields["reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    return {**fields, **(clock.memory_row() if clock else {})}


class TimedSteps:
    """Mixin for a Trainer, ours or GigaTrain's (put before the project's trainer in the bases): the same
    measurement on both sides. `init_seconds` is the time `load` took (data, model, optimizer, engine); a
    StepClock is marked around each forward_step, after each backward and at each step's end
    (save_checkpoint_step, which therefore writes no checkpoint: a 5B one is minutes of I/O, not the step);
    `result()` is the row."""

    def backward_owner(self):
        """The object whose `backward(loss)` runs the backward pass (our strategy, GigaTrain's accelerator)."""
        raise NotImplementedError

    @classmethod
    def load(cls, config):
        start = time.perf_counter()
        trainer = super().load(config)
        trainer.init_seconds = time.perf_counter() - start
        return trainer

    def get_models(self, model_config):
        model = super().get_models(model_config)
        self.num_params = sum(p.numel() for p in model.parameters())
        return model

    def forward_step(self, batch_dict):
        if getattr(self, "clock", None) is None:  # the first step: the engine exists now
            self.clock = StepClock(self.device)
            owner = self.backward_owner()
            owner.backward = self.clock.marking("backward", owner.backward)
        self.clock.mark("start")  # the first step's: building and placing the model
        self.last_loss = super().forward_step(batch_dict)
        self.clock.mark("forward")
        return self.last_loss

    def save_checkpoint_step(self):
        self.clock.tick()

    def result(self):
        return dict(status="ok", step_s=self.clock.mean_step_s(), loss=self.last_loss.item(),
                    init_s=self.init_seconds, params=self.num_params, **memory_fields(self.device, self.clock))
