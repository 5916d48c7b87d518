"""Training state in a form every strategy reads: full tensors keyed by parameter name.

Checkpoints keep each engine's own files (fast and exact under the same strategy and world size).
Resuming under another strategy or world size goes through the forms here:
- `optimizer_dcp/` (NO, DDP, FSDP): torch.distributed.checkpoint, read whole by `read_dcp` (and the
  model's shards, `model_dcp/`, with fsdp_state_dict_type SHARDED_STATE_DICT: layout.py);
- `deepspeed/` (DEEPSPEED): DeepSpeed's universal checkpoint (`ds_to_universal`), read by
  `read_deepspeed`, which also gives the fp32 master weights (the engine may hold bf16 ones).
Both give {"state": {name: {key: tensor}}, "param_groups": [{..., "params": [names]}]}, the full
optimizer state dict of torch.distributed.checkpoint.state_dict."""
import glob
import json
import logging
import os
import shutil
import tempfile

import torch

from ..safe_unpickle import SafeFileSystemReader, load_metadata, safe_torch_loads, torch_load

log = logging.getLogger("giga_train")
DEEPSPEED_DIR, DEEPSPEED_TAG, DEEPSPEED_META = "deepspeed", "state", "giga_meta.json"


def read_dcp(folder):
    """The whole optimizer state that a NO/DDP/FSDP rank set wrote to `folder/optimizer_dcp`."""
    return read_dcp_whole(os.path.join(folder, "optimizer_dcp"), "optimizer")


def read_dcp_whole(source, key):
    """Entry `key` of the torch.distributed.checkpoint folder `source`, every tensor whole (whatever the
    world size that wrote it), on the CPU."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
    load_metadata(os.path.join(source, ".metadata"))  # refused here in one line, before DCP wraps it
    return _load_state_dict_from_keys(storage_reader=SafeFileSystemReader(source))[key]


def deepspeed_meta(folder):
    """{"stage", "world_size"} of the DeepSpeed run that wrote `folder`, or None if none did."""
    path = os.path.join(folder, DEEPSPEED_DIR, DEEPSPEED_META)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def write_deepspeed_meta(folder, stage, world_size):
    with open(os.path.join(folder, DEEPSPEED_DIR, DEEPSPEED_META), "w") as f:
        json.dump(dict(stage=stage, world_size=world_size), f)


def read_deepspeed(folder, names, param_groups):
    """(fp32 weights {name: tensor}, full optimizer state dict) from DeepSpeed's files in `folder`.

    `names`: the trainable parameters' names with their shapes, in the optimizer's order;
    `param_groups`: the optimizer's groups (their hyperparameters are kept, their params renamed)."""
    state_dir = os.path.join(folder, DEEPSPEED_DIR, DEEPSPEED_TAG)
    if not glob.glob(os.path.join(state_dir, "*optim_states.pt")):
        return _read_unpartitioned(state_dir, names, param_groups)
    from ...optimizers.came_zero import read_state_pieces
    rank_states = [torch_load(path)["optimizer_state_dict"]
                   for path in sorted(glob.glob(os.path.join(state_dir, "*optim_states.pt")))]
    came = read_state_pieces(rank_states, names, state_dir)  # CAME8Bit keeps its own pieces (no universal form)
    if came is not None:
        groups = _groups_by_name(param_groups, _saved_inner_state(state_dir)["param_groups"], names)
        return None, dict(state=came, param_groups=groups)
    work = tempfile.mkdtemp(prefix="giga_universal_")
    try:
        _to_universal(state_dir, work)
        return _read_universal(work, state_dir, names, param_groups)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _model_states(folder):
    state_dir = os.path.join(folder, DEEPSPEED_DIR, DEEPSPEED_TAG)
    found = sorted(glob.glob(os.path.join(state_dir, "*mp_rank_00_model_states.pt")))  # ZeRO-3: zero_pp_rank_N_...
    if not found:
        raise FileNotFoundError(f"{state_dir}: no DeepSpeed model states file (*mp_rank_00_model_states.pt)")
    return torch_load(found[0])


def _ties(saved):
    """{a tied parameter's later name: its first name}: DeepSpeed's shared_params (ZeRO-1/2/3), else (ZeRO-0
    leaves it empty) the module's names whose tensor is an earlier name's tensor."""
    if saved.get("shared_params"):
        return dict(saved["shared_params"])
    first, ties = {}, {}
    for k, v in saved["module"].items():
        if torch.is_tensor(v) and v.numel():
            key = (v.data_ptr(), tuple(v.shape), v.dtype)
            if key in first:
                ties[k] = first[key]
            first.setdefault(key, k)
    return ties


def deepspeed_ties(folder):
    """{later name: first name} of the tied parameters of the model DeepSpeed saved in `folder` (whose
    master weights DeepSpeed keeps under the first name only)."""
    return _ties(_model_states(folder))


def deepspeed_parameters(folder):
    """(names with shapes in the optimizer's order, one {"params": [...]} per group) from DeepSpeed's own
    files, for reading its state without the model (giga-train convert)."""
    saved = _model_states(folder)
    groups = saved.get("param_shapes")
    if not groups:  # ZeRO-0 in fp32: the module's own order, without buffers and tied duplicates
        skip = set(saved.get("buffer_names") or ()) | set(_ties(saved))
        groups = [{k: v.shape for k, v in saved["module"].items() if k not in skip}]
    names = [(k, tuple(shape)) for group in groups for k, shape in group.items()]
    return names, [dict(params=list(group)) for group in groups]


def _groups_by_name(ours, saved, names):
    """Our groups with the saved hyperparameters (the lr the scheduler last set), params as names."""
    order = iter(names)
    return [dict({k: v for k, v in {**mine, **theirs}.items() if k != "params"},
                 params=[next(order)[0] for _ in mine["params"]]) for mine, theirs in zip(ours, saved)]


def _read_unpartitioned(state_dir, names, param_groups):
    """ZeRO-0: the engine saved the torch optimizer's own (index-keyed) state dict; in bf16/fp16 inside
    DeepSpeed's wrapper, with the fp32 master weights beside it (then also returned, else None)."""
    saved = torch_load(os.path.join(state_dir, "mp_rank_00_model_states.pt"))
    optim, weights = saved["optimizer"], None
    if "optimizer_state_dict" in optim:  # bf16/fp16: {"optimizer_state_dict", "fp32_groups", loss scale...}
        masters = [t for group in optim.get("fp32_groups") or [] for t in group]
        if len(masters) == len(names):
            weights = {name: t.detach().float().reshape(shape).clone() for (name, shape), t in zip(names, masters)}
        optim = optim["optimizer_state_dict"]
    index_to_name = {}
    order = iter(names)
    for group in optim["param_groups"]:
        for index in group["params"]:
            index_to_name[index] = next(order)[0]
    state = {index_to_name[i]: s for i, s in optim["state"].items()}
    return weights, dict(state=state, param_groups=_groups_by_name(param_groups, optim["param_groups"], names))


def _to_universal(state_dir, out):
    """DeepSpeed's own converter, in this process (it needs the stage 1-2 universal info we save)."""
    import argparse

    from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal
    args = argparse.Namespace(input_folder=state_dir, output_folder=out, num_extract_workers=1,
                              num_merge_workers=1, keep_temp_folder=False, strict=True,
                              inject_missing_state=False)
    with safe_torch_loads():  # its torch.load(weights_only=False) calls go through the allow-list
        ds_to_universal(args)


def _load_piece(path, shape):
    value = torch_load(path)
    value = value["param"] if isinstance(value, dict) else value  # stages 1-2 wrap it; stage 3 is flat
    return value.detach().float().reshape(shape).clone()


def _saved_inner_state(state_dir):
    """Rank 0's inner torch-optimizer state dict: its step count and its groups' hyperparameters
    (the lr the scheduler last set), which the universal form does not carry."""
    path = sorted(glob.glob(os.path.join(state_dir, "*rank_0_*optim_states.pt")))[0]
    saved = torch_load(path)["optimizer_state_dict"]
    return saved.get("base_optimizer_state") or saved["optimizer_state_dict"]  # stages 1-2, stage 3


def _read_universal(work, state_dir, names, param_groups):
    root = os.path.join(work, "zero")
    inner = _saved_inner_state(state_dir)
    step = next(iter(inner["state"].values()))["step"]
    weights, state = {}, {}
    for name, shape in names:
        folder = os.path.join(root, name)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"{state_dir}: DeepSpeed's checkpoint has no parameter '{name}'")
        weights[name] = _load_piece(os.path.join(folder, "fp32.pt"), shape)
        entry = {"step": torch.as_tensor(step, dtype=torch.float32).clone()}
        for path in sorted(glob.glob(os.path.join(folder, "*.pt"))):
            key = os.path.basename(path)[:-3]
            if key not in ("fp32", "step"):
                entry[key] = _load_piece(path, shape)
        state[name] = entry
    return weights, dict(state=state, param_groups=_groups_by_name(param_groups, inner["param_groups"], names))

