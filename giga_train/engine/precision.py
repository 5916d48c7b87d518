"""Mixed precision: which autocast dtype, and whether the loss needs scaling."""
import contextlib
import math

import torch

AUTOCAST_DTYPES = {"no": None, "fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}


class Precision:
    """`autocast()` for forward passes; `scaler` (fp16 only) for loss scaling. Weights stay fp32."""

    def __init__(self, mode, device):
        self.mode, self.device = mode, device
        self.dtype = AUTOCAST_DTYPES[mode or "no"]  # None: train.mixed_precision unset
        self.scaler = torch.amp.GradScaler(device.type) if mode == "fp16" else None

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def scaled_step(self, optimizer):
        """fp16: the scaler's step and update. Returns None when the optimizer stepped, else the loss scale
        after the step the scaler skipped (inf or nan in the gradients: the scale was lowered). GradScaler's
        step reads its inf check on the host already, so reading the scale adds no wait."""
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        after = self.scaler.get_scale()
        return after if after < before or not math.isfinite(after) else None

    def state_dict(self):
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state):
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
