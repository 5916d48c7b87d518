"""Meta-device start: a model whose tensors are on the meta device is materialised piece by piece, so no
rank ever holds the whole model. FSDP2 (`fill`): sharded as it is, then each rank's shard allocated and
filled; DeepSpeed ZeRO-3 (`fill_by_module`): module by module, allocated, filled and partitioned at once.
The weights come from rank 0's real model (broadcast) or from `Trainer.init_weights` (docs/guide.md,
"Large models: starting on the meta device")."""
import contextlib
import glob
import os
from itertools import chain

import torch
import torch.distributed as dist

from ..errors import ConfigError


def on_meta(model):
    return any(t.is_meta for t in chain(model.parameters(), model.buffers()))


# distributed_type -> (launch section, key) that asks for rank-0 loading (Accelerate's keys)
RANK0_LOADING_KEYS = {"FSDP": ("fsdp_config", "fsdp_cpu_ram_efficient_loading"),
                      "DEEPSPEED": ("deepspeed_config", "zero3_init_flag")}


def rank0_loading(launch):
    """The key ('launch.<section>.<key>') under which get_models builds the real model on rank 0 only (the
    others on the meta device), or None."""
    section, key = RANK0_LOADING_KEYS.get(launch.distributed_type, (None, None))
    if section and (launch.get(section) or {}).get(key):
        return f"launch.{section}.{key}"
    return None


def building_context(launch, rank):
    """The context get_models runs in: the meta device on ranks other than 0 under rank-0 loading."""
    return torch.device("meta") if rank0_loading(launch) and rank != 0 else contextlib.nullcontext()


def non_persistent_buffers(model):
    kept = set(model.state_dict())
    return {name: b for name, b in model.named_buffers() if name not in kept}


class MetaStart:
    """Takes the model before sharding (to the meta device, keeping rank 0's tensors under rank-0 loading);
    `fill` (FSDP2, after sharding) or `fill_by_module` (ZeRO-3) materialises it. `from_rank0`: the key that
    asked for rank-0 loading, or None."""

    def __init__(self, model, from_rank0, rank, init_weights=None):
        self.from_rank0, self.rank, self.init_weights = from_rank0, rank, init_weights
        self.full, self.buffers = {}, {}
        if from_rank0 and rank == 0:
            if on_meta(model):
                raise ConfigError(f"{from_rank0}: rank 0's get_models built the model on the meta device; rank 0"
                                  " must build the real model (the others build it on meta)")
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

    def fill_by_module(self, model, device, partition):
        """ZeRO-3: module by module (parents first), its own meta tensors allocated on `device`, filled with
        rank 0's under rank-0 loading (`partition(params)` broadcasts rank 0's parameters as it partitions
        them; buffers are broadcast here) or by its reset_parameters() when that is the default init (whole,
        before partitioning: nothing to gather), its parameters partitioned. Then a user's init_weights (or
        the model's) fills the partitioned model."""
        reset = not self.from_rank0 and self.init_weights is None and not has_own_init_weights(model)
        if reset:
            refuse_non_persistent_buffers(model)
        made = {}  # id(meta parameter) -> (it, its allocated replacement): a tied parameter is allocated once
        for name, module in model.named_modules():
            params, buffers = _allocate_own(module, device, made)
            if self.from_rank0:
                prefix = f"{name}." if name else ""
                with torch.no_grad():
                    for key, tensor in params + buffers if self.rank == 0 else ():
                        key = prefix + key
                        tensor.copy_(self.full.pop(key) if key in self.full else self.buffers.pop(key))
                    for _, buffer in buffers:
                        dist.broadcast(buffer, src=0)
            elif reset:
                reset_module(model, name, module)
            partition([p for _, p in params])
        self.full, self.buffers = {}, {}
        if not self.from_rank0 and not reset:
            (self.init_weights or default_init_weights)(model)


def _allocate_own(module, device, made):
    """`module`'s own meta parameters and buffers replaced by uninitialised ones on `device`: ([(name,
    parameter)], [(name, buffer)]) of those allocated here."""
    params, buffers = [], []
    for key, p in module._parameters.items():
        if p is None or not p.is_meta:
            continue
        if id(p) not in made:
            made[id(p)] = p, torch.nn.Parameter(torch.empty_like(p, device=device), requires_grad=p.requires_grad)
            params.append((key, made[id(p)][1]))
        module._parameters[key] = made[id(p)][1]
    for key, b in module._buffers.items():
        if b is not None and b.is_meta:
            module._buffers[key] = torch.empty_like(b, device=device)
            buffers.append((key, module._buffers[key]))
    return params, buffers


def gathered(params):
    """Context in which ZeRO-3 parameters among `params` are whole on every rank (rank 0's values partitioned
    again on exit); nothing for any other parameter."""
    params = [p for p in params if hasattr(p, "ds_id")]
    if not params:
        return contextlib.nullcontext()
    import deepspeed
    return deepspeed.zero.GatheredParameters(params, modifier_rank=0)


def has_own_init_weights(model):
    return callable(getattr(model, "init_weights", None))


def default_init_weights(model):
    """The model's init_weights(), else every module's reset_parameters(); what neither can fill is named.
    Under ZeRO-3 a module's parameters are gathered while its reset_parameters() runs, the whole model's
    while the model's init_weights() runs (a model-wide method cannot go module by module)."""
    if has_own_init_weights(model):
        with gathered(model.parameters()):
            model.init_weights()
        return
    refuse_non_persistent_buffers(model)
    reset_parameters(model)


def refuse_non_persistent_buffers(model):
    buffers = list(non_persistent_buffers(model))
    if buffers:
        raise ConfigError(f"get_models built {type(model).__name__} on the meta device and its non-persistent"
                          f" buffer '{buffers[0]}' is in no state dict: define {type(model).__name__}.init_weights()"
                          " (or the Trainer's init_weights) to fill the parameters and re-create it")


def reset_parameters(model):
    """Every module's reset_parameters() (parents first), each module's ZeRO-3 parameters gathered while it
    runs; a module with parameters of its own and no reset_parameters is named."""
    for name, module in model.named_modules():
        with gathered(module.parameters(recurse=False)):
            reset_module(model, name, module)


def reset_module(model, name, module):
    if callable(getattr(module, "reset_parameters", None)):
        module.reset_parameters()
    elif any(True for _ in module.parameters(recurse=False)):
        own = next(n for n, _ in module.named_parameters(recurse=False))
        raise ConfigError(f"get_models built {type(model).__name__} on the meta device and nothing fills"
                          f" '{name + '.' if name else ''}{own}' ({type(module).__name__} has no"
                          " reset_parameters): define init_weights()")


def load_safetensors_shards(model, path) -> None:
    """Fill `model`'s parameters and persistent buffers (each rank: its own shard of each DTensor, its own
    partition of each ZeRO-3 parameter) from the safetensors file `path`, or every *.safetensors file in folder
    `path`; each rank reads only its rows (its partition: a contiguous range of the flattened tensor), with
    plain reads straight into its piece (no memory map: the file's pages would count as the rank's memory).
    Call it from init_weights after a meta start. Returns the names filled; a tensor missing or of another
    shape: one line."""
    files = sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) else [path]
    if not files:
        raise ConfigError(f"{path}: no .safetensors file there")
    where = {name: (f, entry) for f in files for name, entry in _safetensors_header(f).items()}
    partitioned = {n: p for n, p in model.named_parameters(remove_duplicate=False) if hasattr(p, "ds_id")}
    filled = []
    for name, target in model.state_dict().items():
        if name not in where:
            raise ConfigError(f"{path}: holds no tensor '{name}' (of {type(model).__name__})")
        file, entry = where[name]
        shape = partitioned[name].ds_shape if name in partitioned else target.shape
        if list(entry["shape"]) != list(shape):
            raise ConfigError(f"{file}: '{name}' has shape {entry['shape']}, the model's is {list(shape)}")
        first, local = _local_piece(name, partitioned[name] if name in partitioned else target)
        if local.numel():
            _read_elements(file, entry, first, local)
        filled.append(name)
    return filled


def _local_piece(name, target):
    """(the index of its first element in the flattened tensor, the tensor to read into) of this rank's piece."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    if hasattr(target, "ds_id"):  # ZeRO-3: rank r holds flat elements [r * n, (r + 1) * n), the last padded
        n = target.ds_tensor.ds_numel
        first = n * target.ds_zero_partition_rank
        return first, target.ds_tensor.narrow(0, 0, max(0, min(n, target.ds_numel - first)))
    if isinstance(target, DTensor):
        shape, offset = compute_local_shape_and_global_offset(target.shape, target.device_mesh, target.placements)
        if any(o or s != full for o, s, full in zip(offset[1:], shape[1:], target.shape[1:])):
            raise ConfigError(f"'{name}': sharded on another dimension than the first; cannot read its rows")
        return (offset[0] if offset else 0) * target.shape[1:].numel(), target.to_local()
    return 0, target


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


def _read_elements(file, entry, first, into):
    """`into.numel()` elements of a tensor stored row-major, from flat index `first` (one contiguous read),
    into `into`: straight into it when it is a contiguous CPU tensor of the file's dtype, else through one
    buffer of its size."""
    dtype = _DTYPES[entry["dtype"]]
    direct = into.dtype == dtype and into.device.type == "cpu" and into.is_contiguous()
    out = into if direct else torch.empty(into.shape, dtype=dtype)
    with open(file, "rb") as f:
        f.seek(entry["data_offsets"][0] + first * dtype.itemsize)
        if f.readinto(out.reshape(-1).view(torch.uint8).numpy()) != into.numel() * dtype.itemsize:
            raise ConfigError(f"{file}: ends inside tensor data (truncated?)")
    if not direct:
        into.copy_(out)
