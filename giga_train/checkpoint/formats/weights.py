"""What goes into a checkpoint folder besides the engine's own files: weights and training state."""
import glob
import json
import os
import random
from collections import defaultdict

import numpy as np
import torch

from ..checksums import inside

WEIGHTS_SAFE, WEIGHTS_PICKLE = ".safetensors", ".bin"
FINITE_KEY = "giga_train_finite"


def save_weights(folder, state_dict, members=None, safe=True):
    """`model.safetensors` (or one `{member}.safetensors` per ModuleDict member) in `folder`: the layout
    before GigaTrain's (kept for `giga-train convert --to full`; checkpoints use layout.py)."""
    os.makedirs(folder, exist_ok=True)
    groups = {"model": state_dict}
    if members:
        groups = defaultdict(dict)
        for key, value in state_dict.items():
            member, _, rest = key.partition(".")
            groups[member][rest] = value
    for name, group in groups.items():
        write_tensors(os.path.join(folder, name + (WEIGHTS_SAFE if safe else WEIGHTS_PICKLE)), group, safe)


def write_tensors(path, tensors, safe=True):
    """One weights file: safetensors recording whether every float was finite (rotation reads it,
    manager.weights_finite), or torch.save with `safe=False` (checkpoint_safe_serialization=False)."""
    group = _unshared({k: v.detach().cpu().contiguous() for k, v in tensors.items()})
    if safe:
        from safetensors.torch import save_file
        finite = all(bool(torch.isfinite(v).all()) for v in group.values() if v.is_floating_point())
        save_file(group, path, metadata={"format": "pt", FINITE_KEY: "true" if finite else "false"})
    else:
        torch.save(group, path)


def load_weights(folder, members=None):
    """The state dict that save_weights wrote (member prefixes restored)."""
    state = {}
    files = sorted(f for f in os.listdir(folder) if f.endswith((WEIGHTS_SAFE, WEIGHTS_PICKLE)))
    if not files:
        raise FileNotFoundError(f"{folder}: no model weights (*.safetensors or *.bin)")
    for name in files:
        path = os.path.join(folder, name)
        if name.endswith(WEIGHTS_SAFE):
            from safetensors.torch import load_file
            group = load_file(path)
        else:
            group = torch.load(path, map_location="cpu", weights_only=True)
        prefix = name.rsplit(".", 1)[0] + "." if members else ""
        state.update({prefix + k: v for k, v in group.items()})
    return state


def _unshared(group):
    """safetensors refuses tensors that share memory (tied weights): store each its own copy."""
    seen, out = set(), {}
    for key, value in group.items():
        ptr = value.untyped_storage().data_ptr() if value.numel() else None
        out[key] = value.clone() if ptr is not None and ptr in seen else value
        seen.add(ptr)
    return out


def rng_state():
    state = {
        "python": random.getstate(),
        "numpy": _numpy_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _numpy_state():
    """numpy's state as plain values and a tensor, so it loads with weights_only=True."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached))


WEIGHTS_NAME = "diffusion_pytorch_model.bin"  # diffusers' names, which GigaTrain's checkpoints use
SAFETENSORS_WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
# The weights files of a model folder, most specific first: GigaTrain's (diffusers') names, then
# transformers'. Big models may be sharded: `<stem>-00001-of-0000N.<ext>` with `<name>.index.json`
# (diffusers and transformers name them so); the index's weight_map names each tensor's shard.
WEIGHTS_NAMES = (WEIGHTS_NAME, SAFETENSORS_WEIGHTS_NAME, "model.safetensors", "pytorch_model.bin")


def _weights_files(folder):
    """The files holding a model folder's weights: one file, or the shards an index lists."""
    for name in WEIGHTS_NAMES:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return [path]
    for name in WEIGHTS_NAMES:
        index = os.path.join(folder, name + ".index.json")
        if os.path.isfile(index):
            with open(index) as f:
                weight_map = json.load(f).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"{index}: no weight_map")
            shards = sorted(set(weight_map.values()))
            outside = next((shard for shard in shards if not inside(folder, shard)), None)
            if outside is not None:
                raise ValueError(f"{index}: names shard {outside!r} outside the folder; nothing is read from there")
            return [os.path.join(folder, shard) for shard in shards]
    found = sorted(glob.glob(os.path.join(folder, "*.safetensors")) + glob.glob(os.path.join(folder, "*.bin")))
    if len(found) == 1:
        return found
    raise FileNotFoundError(f"{folder}: no weights file ({WEIGHTS_NAME}, {SAFETENSORS_WEIGHTS_NAME}, or one "
                            f"*.safetensors / *.bin)" if not found else f"{folder}: several weights files: "
                            f"{', '.join(os.path.basename(f) for f in found)}")


def load_state_dict(weight_path, weights_only=True):
    """A state dict on the CPU from a weights file, or from a model folder (GigaTrain's
    diffusion_pytorch_model.{bin,safetensors}, else model.safetensors, pytorch_model.bin, the shards of
    a `*.index.json`, or its one *.safetensors / *.bin file). `weights_only` goes to torch.load (True:
    no pickled code runs)."""
    if os.path.isdir(weight_path):
        state = {}
        for path in _weights_files(weight_path):
            state.update(load_state_dict(path, weights_only))
        return state
    if not os.path.isfile(weight_path):
        raise FileNotFoundError(f"no weights at {weight_path}")
    if weight_path.endswith(".safetensors"):
        from safetensors.torch import load_file
        return load_file(weight_path, device="cpu")
    return torch.load(weight_path, map_location="cpu", weights_only=weights_only)


def save_state_dict(state_dict, save_path):
    """Write `state_dict` to `save_path` (safetensors for *.safetensors, else torch.save), making the folder."""
    os.makedirs(os.path.dirname(os.path.abspath(save_path)), exist_ok=True)
    if save_path.endswith(".safetensors"):
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in state_dict.items()}, save_path)
    else:
        torch.save(state_dict, save_path)
