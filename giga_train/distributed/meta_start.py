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
    safetensors file `path`, or every *.safetensors file in folder `path`; each rank reads only its rows,
    with plain reads straight into its shard (no memory map: the file's pages would count as the rank's
    memory). Call it from init_weights after a meta start. Returns the names filled; a tensor missing or of
    another shape: one line."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    files = sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) else [path]
    if not files:
        raise ConfigError(f"{path}: no .safetensors file there")
    where = {name: (f, entry) for f in files for name, entry in _safetensors_header(f).items()}
    filled = []
    for name, target in model.state_dict().items():
        if name not in where:
            raise ConfigError(f"{path}: holds no tensor '{name}' (of {type(model).__name__})")
        file, entry = where[name]
        if list(entry["shape"]) != list(target.shape):
            raise ConfigError(f"{file}: '{name}' has shape {entry['shape']}, the model's is {list(target.shape)}")
        rows, first = target.shape[0] if target.dim() else 1, 0
        local = target
        if isinstance(target, DTensor):
            shape, offset = compute_local_shape_and_global_offset(target.shape, target.device_mesh, target.placements)
            if any(o or s != full for o, s, full in zip(offset[1:], shape[1:], target.shape[1:])):
                raise ConfigError(f"'{name}': sharded on another dimension than the first; cannot read its rows")
            rows, first, local = shape[0] if shape else 1, offset[0] if offset else 0, target.to_local()
        if local.numel():
            _read_rows(file, entry, first, rows, local)
        filled.append(name)
    return filled


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def _safetensors_header(file):
    """{name: {"dtype", "shape", "data_offsets" (absolute)}} of a safetensors file."""
    import json
    import struct
    with open(file, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    for entry in header.values():
        entry["data_offsets"] = [8 + size + o for o in entry["data_offsets"]]
    return header


def _read_rows(file, entry, first, rows, into):
    """Rows [first, first + rows) of a tensor stored row-major (one contiguous read) into `into`: straight
    into it when it is a contiguous CPU tensor of the file's dtype, else through one buffer of its size."""
    dtype, shape = _DTYPES[entry["dtype"]], entry["shape"]
    per_row = torch.Size(shape[1:]).numel() * dtype.itemsize
    direct = into.dtype == dtype and into.device.type == "cpu" and into.is_contiguous()
    out = into if direct else torch.empty(into.shape, dtype=dtype)
    with open(file, "rb") as f:
        f.seek(entry["data_offsets"][0] + first * per_row)
        if f.readinto(out.reshape(-1).view(torch.uint8).numpy()) != rows * per_row:
            raise ConfigError(f"{file}: ends inside tensor data (truncated?)")
    if not direct:
        into.copy_(out)
