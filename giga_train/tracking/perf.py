"""Performance scalars for the log: peak memory, and from a FLOPs count, achieved TFLOP/s, tokens/s and MFU.
Nothing here waits for the device: the allocator's counters and the clock are host values."""
import contextlib
import resource
import sys

import torch

# Dense bf16 tensor-core peaks (FLOP/s) by device-name fragment; MFU is measured against these unless
# train.peak_flops says otherwise (an fp32 run, a clock-limited card).
PEAK_FLOPS = (("H200", 989e12), ("H100", 989e12), ("H800", 989e12), ("A100", 312e12), ("A800", 312e12),
              ("B200", 2250e12), ("L40S", 362e12))


def device_peak_flops(device):
    """The table's peak for a CUDA device, else None (no MFU on CPU or an unknown card)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for fragment, peak in PEAK_FLOPS if fragment in name), None)


def peak_memory(device):
    """The peak since the process started (never reset here: a caller's own reading stays whole). CUDA: the
    most memory tensors held on the device. CPU: the process's peak resident set."""
    if device.type == "cuda":
        return {"peak_allocated_gb": torch.cuda.max_memory_allocated(device) / 1e9}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return {"peak_rss_gb": rss * (1 if sys.platform == "darwin" else 1024) / 1e9}


class PerfMeter:
    """Adds peak memory, and with a FLOPs figure tflops_per_device, tokens_per_sec and mfu, to each log step.

    FLOPs per sample come from train.flops_per_sample, or with train.count_flops from the model counted once
    before the run (use_flops_per_sample), else from one training step counted by torch.utils.flop_counter
    (matmuls, convolutions and attention, forward and backward, on this rank)."""

    def __init__(self, train, device, world_size, samples_per_step, count_at_step):
        self.device, self.world_size, self.samples_per_step = device, world_size, samples_per_step
        self.flops_per_sample = train.get("flops_per_sample")
        self.tokens_per_sample = train.get("tokens_per_sample")
        self.peak_flops = train.get("peak_flops") or device_peak_flops(device)
        self.count_at_step = count_at_step if train.get("count_flops") and self.flops_per_sample is None else None

    def use_flops_per_sample(self, flops):
        """FLOPs per sample counted before the run (trainers/flop_count.py): no step is counted then."""
        if flops:
            self.flops_per_sample, self.count_at_step = flops, None

    def counting(self, step):
        """Around the training step numbered `step` (1-based): counts its FLOPs when it is the one chosen."""
        if step != self.count_at_step:
            return contextlib.nullcontext()
        return self._count()

    @contextlib.contextmanager
    def _count(self):
        from torch.utils.flop_counter import FlopCounterMode
        counter = FlopCounterMode(display=False)
        with counter:
            yield
        # every rank runs the same step on its own samples: this rank's FLOPs x ranks / the step's samples
        self.flops_per_sample = counter.get_total_flops() * self.world_size / self.samples_per_step

    def scalars(self, samples_per_sec):
        out = peak_memory(self.device)
        if self.tokens_per_sample:
            out["tokens_per_sec"] = samples_per_sec * self.tokens_per_sample
        if self.flops_per_sample:
            per_device = samples_per_sec * self.flops_per_sample / self.world_size
            out["tflops_per_device"] = per_device / 1e12
            if self.peak_flops:
                out["mfu"] = per_device / self.peak_flops
        return out
