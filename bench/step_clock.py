"""One way to time training steps for both sides of bench/wan.py (our Trainer and the real GigaTrain's): a
timestamp at each step's end after the device has finished the step's work, and the mean step over the
second half. Both trainers call save_checkpoint_step once per optimizer step, which is where it is read."""
import time

import torch


class StepClock:
    def __init__(self, device):
        self.device = torch.device(device)
        self.ends = [time.perf_counter()]

    def tick(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.ends.append(time.perf_counter())

    def mean_step_s(self):
        """Mean seconds per step over the second half of the steps (the first half warms up)."""
        steps = [b - a for a, b in zip(self.ends, self.ends[1:])]
        timed = steps[len(steps) // 2:]
        return sum(timed) / len(timed) if timed else float("nan")


def peak_memory_gib(device):
    """torch.cuda.max_memory_allocated on CUDA; the process's peak RSS on CPU."""
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
