"""Meta-device start under FSDP2: a model whose tensors are on the meta device (no memory) is sharded as it
is, then only each rank's shard is allocated (`to_empty`) and filled, so no rank ever holds the whole model.

Filled from one of two sources:
- launch.fsdp_config.fsdp_cpu_ram_efficient_loading (Accelerate's key): rank 0 built the real model in
  get_models (the other ranks built it under `torch.device("meta")`); its weights are broadcast tensor by
  tensor into every rank's shard, its non-persistent buffers (rotary tables...) whole. Rank 0 holds the
  model once plus its shard; every other rank its shard plus one tensor.
- otherwise (get_models built on the meta device itself): `Trainer.init_weights(model)`, by default the
  model's own `init_weights()`, else every module's `reset_parameters()`. Pretrained weights can be read
  shard by shard from safetensors there with `load_safetensors_shards` (each rank reads its rows only).
Non-persistent buffers are not in a state dict: after `to_empty` they hold garbage until init_weights
re-creates them, so a model that has some must define init_weights (said in one line otherwise)."""
import contextlib
import glob
import os
from itertools import chain

import torch
import torch.distributed as dist

from ..errors import ConfigError


def on_meta(model):
    return any(t.is_meta for t in chain(model.parameters(), model.buffers()))


def rank0_loading(launch):
    """Whether get_models builds the real model on rank 0 only (the others on the meta device)."""
    fsdp = launch.get("fsdp_config") or {}
    return launch.distributed_type == "FSDP" and bool(fsdp.get("fsdp_cpu_ram_efficient_loading"))


def building_context(launch, rank):
    """The context get_models runs in: the meta device on ranks other than 0 under rank-0 loading."""
    return torch.device("meta") if rank0_loading(launch) and rank != 0 else contextlib.nullcontext()


def non_persistent_buffers(model):
    kept = set(model.state_dict())
    return {name: b for name, b in model.named_buffers() if name not in kept}


class MetaStart:
    """Takes the model before sharding (to the meta device, keeping rank 0's tensors under rank-0 loading);
    `fill(model)` after sharding and `to_empty` fills each rank's shard."""

    def __init__(self, model, from_rank0, rank, init_weights=None):
        self.from_rank0, self.rank, self.init_weights = from_rank0, rank, init_weights
        self.full, self.buffers = {}, {}
        if from_rank0 and rank == 0:
            if on_meta(model):
                raise ConfigError("launch.fsdp_config.fsdp_cpu_ram_efficient_loading: rank 0's get_models built"
                                  " the model on the meta device; rank 0 must build the real model (the others"
                                  " build it on meta)")
            self.full = model.state_dict()  # references: rank 0's only copy, dropped once broadcast
            self.buffers = {k: v.detach().clone() for k, v in non_persistent_buffers(model).items()}
        model.to("meta")  # rank 0 too: every rank shards the same meta model

    def fill(self, model, device):
        model.to_empty(device=device)
        if not self.from_rank0:
            (self.init_weights or default_init_weights)(model)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        set_model_state_dict(model, self.full, options=StateDictOptions(full_state_dict=True,
                                                                       broadcast_from_rank0=True))
        for name, buffer in non_persistent_buffers(model).items():
            if self.rank == 0:
                buffer.copy_(self.buffers[name])
            dist.broadcast(buffer, src=0)
        self.full, self.buffers = {}, {}


def default_init_weights(model):
    """The model's init_weights(), else every module's reset_parameters(); what neither can fill is named."""
    if callable(getattr(model, "init_weights", None)):
        model.init_weights()
        return
    buffers = list(non_persistent_buffers(model))
    if buffers:
        raise ConfigError(f"get_models built {type(model).__name__} on the meta device and its non-persistent"
                          f" buffer '{buffers[0]}' is in no state dict: define {type(model).__name__}.init_weights()"
                          " (or the Trainer's init_weights) to fill the parameters and re-create it")
    for name, module in model.named_modules():
        if callable(getattr(module, "reset_parameters", None)):
            module.reset_parameters()
        elif any(True for _ in module.parameters(recurse=False)):
            own = next(n for n, _ in module.named_parameters(recurse=False))
            raise ConfigError(f"get_models built {type(model).__name__} on the meta device and nothing fills"
                              f" '{name + '.' if name else ''}{own}' ({type(module).__name__} has no"
                              " reset_parameters): define init_weights()")


def load_safetensors_shards(model, path):
    """Fill `model`'s parameters and persistent buffers (each rank: its own shard of each DTensor) from the
    safetensors file `path`, or every *.safetensors file in folder `path`; each rank reads only its rows.
    Call it from init_weights after a meta start. Returns the names filled; a tensor missing: one line."""
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    files = sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) else [path]
    if not files:
        raise ConfigError(f"{path}: no .safetensors file there")
    state, filled = model.state_dict(), []
    with contextlib.ExitStack() as stack:
        opened = [stack.enter_context(safe_open(f, framework="pt")) for f in files]
        where = {key: f for f in opened for key in f.keys()}
        for name, target in state.items():
            if name not in where:
                raise ConfigError(f"{path}: holds no tensor '{name}' (of {type(model).__name__})")
            rows = where[name].get_slice(name)
            if isinstance(target, DTensor):
                shape, offset = compute_local_shape_and_global_offset(target.shape, target.device_mesh,
                                                                      target.placements)
                local = target.to_local()
                if local.numel():
                    local.copy_(rows[tuple(slice(o, o + s) for o, s in zip(offset, shape))])
            else:
                target.copy_(rows[:])
            filled.append(name)
    return filled
