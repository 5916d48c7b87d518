"""ModuleDict: several modules trained as one unit; `model("name", ...)` runs that member's forward."""
from collections import OrderedDict
from typing import Any

from torch import nn
from torch.nn.modules.module import _IncompatibleKeys


class ModuleDict(nn.ModuleDict):
    """Calling the (wrapped) ModuleDict with a member name dispatches to that member.

    The call goes through the outer module's __call__, so a DDP/FSDP/DeepSpeed wrapper around the
    whole dict sees every forward and its hooks (gradient sync, unsharding) fire."""

    # GigaTrain's switch: 'each' loads every member through its own load_state_dict (a PEFT or LoRA wrapper
    # that maps its keys there); None: torch's one load over the whole dict. Under 'each' the state dict is
    # also each member's own (giga_models' LoRAPeftWrapper maps its keys only when called without a prefix,
    # as torch's recursion calls it: its adapters would be missing from every checkpoint, as in GigaTrain's).
    load_state_dict_mode = None

    def __init__(self, modules=None, **named) -> None:
        super().__init__({**(modules or {}), **named})

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        if self.load_state_dict_mode != "each" or args:
            return super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        out = OrderedDict() if destination is None else destination
        for name, member in self.items():
            for key, value in member.state_dict(keep_vars=keep_vars).items():
                out[f"{prefix}{name}.{key}"] = value
        return out

    def load_state_dict(self, state_dict, strict=True, assign=False):
        mode = self.load_state_dict_mode
        if mode is None:
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        if mode != "each":
            raise ValueError(f"ModuleDict.load_state_dict_mode={mode!r}: GigaTrain's modes are None and 'each'")
        missing, unexpected, rest = [], [], dict(state_dict)
        for name, member in self.items():
            prefix = name + "."
            part = {k[len(prefix):]: rest.pop(k) for k in list(rest) if k.startswith(prefix)}
            result = member.load_state_dict(part, strict=False, **({"assign": True} if assign else {}))
            if result is not None:
                missing += [prefix + k for k in result.missing_keys]
                unexpected += [prefix + k for k in result.unexpected_keys]
        unexpected += list(rest)  # under no member's name
        if strict and (missing or unexpected):
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__} (load_state_dict_mode="
                               f"'each'): missing {missing[:5]}, unexpected {unexpected[:5]}")
        return _IncompatibleKeys(missing, unexpected)

    def forward(self, name, *args, **kwargs) -> Any:
        if name not in self:
            raise KeyError(f"ModuleDict has no member '{name}' (members: {', '.join(self.keys())})")
        return self[name](*args, **kwargs)
