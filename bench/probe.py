"""What the throughput bench measures around training steps, the same way for giga-train and for the
hand-written loop: the clock, host-device syncs, and an optional torch.profiler window."""
import time
import warnings

import torch

GEMM_NAMES = ("gemm", "nvjet", "cutlass", "matmul", "xmma", "scaled_mm", "aten::mm", "aten::addmm", "aten::bmm")
ATTENTION_NAMES = ("flash", "fmha", "attention", "sdpa")


class StepProbe:
    """Call before_step(done) and after_step(done) with the number of steps completed.

    Steps [0, warmup) are warm-up (compilation, allocator, cuBLAS handles); steps [warmup, steps) are
    timed, between two device syncs, and on CUDA run under sync-debug mode, which counts any
    host-device synchronisation the loop makes; steps [steps, steps + profile_steps) are profiled."""

    def __init__(self, device, warmup, steps, profile_steps=0):
        if not 1 <= warmup < steps:
            raise ValueError(f"need 1 <= warmup < steps, got warmup={warmup}, steps={steps}")
        self.device, self.warmup, self.steps, self.profile_steps = device, warmup, steps, profile_steps
        self.cuda = device.type == "cuda"
        self.begin = self.start = self.end = None
        self.syncs = None
        self.profile = None
        self._catcher = self._records = self._profiler = None

    @property
    def total_steps(self):
        return self.steps + self.profile_steps

    def _now(self):
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def before_step(self, done):
        if done == 0:
            self.begin = self._now()
        if done == self.warmup:
            self.start = self._now()
            self._watch_syncs(True)
        if done == self.steps and self.profile_steps:
            self._start_profiler()

    def after_step(self, done):
        if done == self.steps:
            self._watch_syncs(False)
            self.end = self._now()
        if done == self.total_steps and self._profiler is not None:
            self._stop_profiler()

    def _watch_syncs(self, on):
        if not self.cuda:
            return
        if on:
            self._catcher = warnings.catch_warnings(record=True)
            self._records = self._catcher.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        else:
            torch.cuda.set_sync_debug_mode("default")
            self._catcher.__exit__(None, None, None)
            self.syncs = sum("synchroniz" in str(w.message) for w in self._records)

    def _start_profiler(self):
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._profiler = profile(activities=activities)
        self._profile_begin = self._now()
        self._profiler.start()

    def _stop_profiler(self):
        self._profiler.stop()
        wall = self._now() - self._profile_begin
        self.profile = summarize_profile(self._profiler, self.profile_steps, wall, self.cuda)
        self._profiler = None

    def result(self, tokens_per_step):
        """Timing of the timed window (seconds, tokens/s) and what the warm-up cost beyond steady state."""
        timed = self.end - self.start
        step_s = timed / (self.steps - self.warmup)
        warmup_s = self.start - self.begin
        return dict(step_ms=1000 * step_s, tokens_per_s=tokens_per_step / step_s, warmup_s=warmup_s,
                    compile_s=max(warmup_s - self.warmup * step_s, 0.0), syncs=self.syncs, profile=self.profile)


def _self_time_us(event, cuda):
    if not cuda:
        return event.self_cpu_time_total
    value = getattr(event, "self_device_time_total", None)
    return value if value is not None else getattr(event, "self_cuda_time_total", 0)


def kernel_kind(name):
    low = name.lower()
    if any(k in low for k in ATTENTION_NAMES):
        return "attention"
    if any(k in low for k in GEMM_NAMES):
        return "gemm"
    return "other"


def summarize_profile(prof, steps, wall_s, cuda, top=25):
    """Top kernels (CUDA) or ops (CPU) by self time per step, the share of GEMM / attention / other,
    and how busy the device was over the profiled steps' wall time."""
    events = []
    for e in prof.key_averages():
        us = _self_time_us(e, cuda)
        on_device = not cuda or getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
        # A range such as "Optimizer.step#AdamW.step" also appears on the device timeline: not a kernel.
        if us > 0 and on_device and not getattr(e, "is_user_annotation", False):
            events.append((us, e.key, e.count))
    events.sort(reverse=True)
    total = sum(us for us, _, _ in events) or 1.0
    kinds = {}
    for us, name, _ in events:
        kinds[kernel_kind(name)] = kinds.get(kernel_kind(name), 0.0) + us
    step_ms = 1000 * wall_s / steps
    return dict(
        steps=steps, step_ms=step_ms, device_busy=(total / 1000 / steps) / step_ms if cuda else None,
        share={k: v / total for k, v in sorted(kinds.items())},
        top=[dict(name=name[:120], ms_per_step=us / 1000 / steps, share=us / total, calls_per_step=count / steps)
             for us, name, count in events[:top]])
