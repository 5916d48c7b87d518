"""A guard for a torch bug on the CPU: on CPUs with AVX512-BF16 (seen on AMD EPYC, torch 2.13.0+cpu and
2.14.1+cu130) oneDNN's bf16 Conv3d weight gradient comes out inf or nan at random, under autocast and with
bf16 weights alike, so a bf16 run of a video model on the CPU skips steps or diverges. Where the model holds a
Conv3d and the run computes in bf16 on the CPU, oneDNN is turned off for the run (torch's own kernels: finite,
deterministic; on again when the run ends) with one log line, when the CPU has AVX512-BF16 or a few probe
backward passes show the bug (the probe alone is not enough: whether it hits depends on the memory it reads,
and in a long test session 12 probes passed while the run's own steps were inf). Elsewhere nothing changes."""
import logging

import torch
from torch import nn

log = logging.getLogger("giga_train")
PROBES = 12  # the bug hit 1 to 4 of 6 passes in the runs seen: 12 miss it with a chance below 1e-3


def onednn_conv3d_broken(probes=PROBES) -> bool:
    """Whether bf16 Conv3d weight gradients through oneDNN come out non-finite here (global RNG untouched)."""
    gen = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        conv = nn.Conv3d(16, 4, 3, padding=1).to(torch.bfloat16)
    x = torch.randn(2, 16, 2, 4, 4, generator=gen).to(torch.bfloat16)
    for _ in range(probes):
        conv.zero_grad()
        conv(x).float().pow(2).mean().backward()
        if not torch.isfinite(conv.weight.grad).all():
            return True
    return False


def cpu_has_avx512_bf16() -> bool:
    """Whether this CPU announces AVX512-BF16 (Linux's /proc/cpuinfo; False where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            return "avx512_bf16" in f.read().split()
    except OSError:
        return False


def conv3d_bug_expected() -> bool:
    return cpu_has_avx512_bf16() or onednn_conv3d_broken()


def guard_cpu_conv3d(model, device, mixed_precision) -> bool:
    """Turn oneDNN off when this run would meet the bug (see the module); returns whether it did."""
    if device.type != "cpu" or not torch.backends.mkldnn.enabled:
        return False
    bf16 = mixed_precision in ("bf16", "fp8") or any(p.dtype == torch.bfloat16 for p in model.parameters())
    if not bf16 or not any(isinstance(m, nn.Conv3d) for m in model.modules()) or not conv3d_bug_expected():
        return False
    torch.backends.mkldnn.enabled = False
    log.warning("bf16 Conv3d on this CPU: oneDNN's weight gradients can come out inf/nan (torch %s); "
                "oneDNN is off for this run (torch.backends.mkldnn.enabled=False)", torch.__version__)
    return True
