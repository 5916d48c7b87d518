"""Mixed precision: which autocast dtype, and whether the loss needs scaling."""
import contextlib

import torch

AUTOCAST_DTYPES = {"no": None, "fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}


class Precision:
    """`autocast()` for forward passes; `scaler` (fp16 only) for loss scaling. Weights stay fp32."""

    def __init__(self, mode, device):
        self.mode, self.device = mode, device
        self.dtype = AUTOCAST_DTYPES[mode]
        self.scaler = torch.amp.GradScaler(device.type) if mode == "fp16" else None

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def state_dict(self):
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state):
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
