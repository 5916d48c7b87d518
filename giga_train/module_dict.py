"""ModuleDict: several modules trained as one unit; `model("name", ...)` runs that member's forward."""
from typing import Any

from torch import nn


class ModuleDict(nn.ModuleDict):
    """Calling the (wrapped) ModuleDict with a member name dispatches to that member.

    The call goes through the outer module's __call__, so a DDP/FSDP/DeepSpeed wrapper around the
    whole dict sees every forward and its hooks (gradient sync, unsharding) fire."""

    def __init__(self, modules=None, **named) -> None:
        super().__init__({**(modules or {}), **named})

    def forward(self, name, *args, **kwargs) -> Any:
        if name not in self:
            raise KeyError(f"ModuleDict has no member '{name}' (members: {', '.join(self.keys())})")
        return self[name](*args, **kwargs)
