"""The device-side skip contract: `optimizer.found_inf` set before step() (as torch's GradScaler does)."""
import torch


def supports_found_inf(optimizer):
    """Whether optimizer.step() skips on the device when `optimizer.found_inf` (a 0-dim float32 device
    tensor) is 1.0, leaving parameters and all state (step counts too) untouched: torch's Adam/AdamW
    with fused=True (the attribute GradScaler sets), or an optimizer class with `supports_found_inf = True`."""
    declared = getattr(optimizer, "supports_found_inf", None)
    if declared is not None:
        return bool(declared)
    return isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) and all(
        g.get("fused") for g in optimizer.param_groups)
