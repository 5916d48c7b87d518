"""What goes into a checkpoint folder besides the engine's own files: weights and training state."""
import os
import random
from collections import defaultdict

import numpy as np
import torch

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
