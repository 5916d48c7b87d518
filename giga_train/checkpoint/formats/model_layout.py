"""GigaTrain's model layout inside a checkpoint folder, and reading the weights back from it.

One folder per ModuleDict member that `from_pretrained` reads (`<name>_ema/` with EMA, the live weights then
in `model.safetensors` at the root), or under FSDP's SHARDED_STATE_DICT each rank's shards in `model_dcp/`
(`ema_dcp/`); a PEFT adapter member: PeftModel's own files in its folders (adapters.py). meta.json's `layout`
records the folders and their key prefixes, so a checkpoint reads back without the model that wrote it
(docs/checkpoints.md)."""
import copy
import json
import os
import sys

import torch
from torch.distributed.tensor import DTensor

from ...errors import CorruptCheckpointError
from ...module_dict import ModuleDict
from ..checksums import inside
from .weights import SAFETENSORS_WEIGHTS_NAME, WEIGHTS_NAME, load_state_dict
from .full_state import read_dcp_whole
from .adapters import adapter_keys, adapter_layout, model_keys, write_adapter
from .weights import FINITE_KEY, load_weights, write_tensors

LIVE_WITH_EMA = "model.safetensors"  # Accelerate's name, where GigaTrain's live weights are with EMA on
MODEL_SHARDS, EMA_SHARDS = "model_dcp", "ema_dcp"  # SHARDED_STATE_DICT: each rank's shards
SHARDS_KEY = "model"
EMA_SUFFIX = "_ema"
CONFIG = "config.json"


def model_folders(module, model_name="model"):
    """[(folder, key prefix, submodule)]: one per member of our ModuleDict (GigaTrain splits its own
    ModuleDict only), else the whole module under `model_name`."""
    if isinstance(module, ModuleDict):
        return [(name, name + ".", member) for name, member in module.items()]
    return [(model_name, "", module)]


def layout_meta(module, model_name, ema, sharded=False):
    """meta.json's `layout`: {folder: key prefix} and where the live weights are (for reading back and
    for the finiteness check of rotation); `sharded`: the weights are in MODEL_SHARDS (and EMA_SHARDS)."""
    folders = {folder: prefix for folder, prefix, _ in model_folders(module, model_name)}
    adapters = adapter_layout((f, m) for f, _, m in model_folders(module, model_name))  # PEFT's: adapters.py
    if sharded:
        layout = dict(models=folders, live=[MODEL_SHARDS], sharded=True)
    else:  # with adapters the live weights stay in the member folders, EMA or not (write_live)
        layout = dict(models=folders, live=[LIVE_WITH_EMA] if ema and not adapters else sorted(folders))
    return dict(layout, adapters=adapters) if adapters else layout


def is_sharded(meta):
    """Whether the checkpoint a meta.json describes holds the model as each rank's shards."""
    layout = meta.get("layout")
    return isinstance(layout, dict) and bool(layout.get("sharded"))


def shards_folder(checkpoint, ema=False):
    return os.path.join(checkpoint, EMA_SHARDS if ema else MODEL_SHARDS)


def sharded_folder_hint(path):
    """What to do when model folder `path` is missing from a checkpoint that holds the model as shards
    ('' when `path` is not in such a checkpoint)."""
    checkpoint = os.path.dirname(os.path.normpath(path))
    try:
        with open(os.path.join(checkpoint, "meta.json")) as f:
            sharded = is_sharded(json.load(f))
    except (OSError, ValueError):
        return ""
    return (f" ({checkpoint} holds the model as each rank's shards, fsdp_state_dict_type='SHARDED_STATE_DICT':"
            f" `giga-train export {checkpoint} --to hf` or `convert {checkpoint} --to full` writes its weights)"
            if sharded else "")


def write_shards(folder, state, process_group=None):
    """Every rank writes its own shards of `state` (DTensors; a tensor every rank holds whole is written
    once) into the DCP folder `folder`: a collective over `process_group`, with no gather of the model.
    Whether every shard was finite goes into the file FINITE_KEY beside them (rotation reads it)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from ..quiet_dcp import quiet_single_process
    with quiet_single_process():
        dcp.save({SHARDS_KEY: state}, checkpoint_id=folder, process_group=process_group)
    finite = [all(bool(torch.isfinite(t).all()) for v in state.values() for t in _local_parts(v)
                  if t.is_floating_point())]
    if dist.is_initialized():
        everyone = [None] * dist.get_world_size(process_group)
        dist.all_gather_object(everyone, finite[0], group=process_group)
        finite = everyone
    if not dist.is_initialized() or dist.get_rank(process_group) == 0:
        with open(os.path.join(folder, FINITE_KEY), "w") as f:
            f.write("true" if all(finite) else "false")


def _local_parts(value):
    """The tensors this rank holds of a state dict value: a DTensor's shard, FSDP1's ShardedTensor's."""
    if isinstance(value, DTensor):
        return [value.to_local()]
    if callable(getattr(value, "local_shards", None)):
        return [shard.tensor for shard in value.local_shards()]
    return [value] if isinstance(value, torch.Tensor) else []


def layout_problem(checkpoint, meta):
    """One line when meta.json's `layout` names a folder or file outside `checkpoint` (a rewritten
    meta.json, a symlink out): nothing is read from there. None when it stays inside."""
    layout = meta.get("layout")
    if not isinstance(layout, dict):
        return None
    models, live = layout.get("models", {}), layout.get("live", [])
    if not isinstance(models, dict) or not isinstance(live, list):
        return f"{os.path.join(checkpoint, 'meta.json')}: its layout is damaged"
    for rel in [*models, *[folder + EMA_SUFFIX for folder in models], *live]:
        if not inside(checkpoint, rel):
            return (f"{os.path.join(checkpoint, 'meta.json')}: layout entry {rel!r} points outside the checkpoint"
                    " folder (meta.json is not the one its save wrote)")
    return None


def live_weights(meta):
    """The paths (relative to the checkpoint) of the live weights a meta.json describes."""
    layout = meta.get("layout")
    return layout["live"] if isinstance(layout, dict) else ["model"]


def write_live(root, module, state, model_name, ema, safe):
    """The live weights: the model folders, or (with EMA, as GigaTrain) one file at the root; a model with PEFT
    adapters keeps its folders (an adapter's own, as without EMA), EMA or not."""
    if ema and not adapter_layout((f, m) for f, _, m in model_folders(module, model_name)):
        write_tensors(os.path.join(root, LIVE_WITH_EMA), state, safe=True)
    else:
        write_model_folders(root, module, state, model_name, safe)


def write_model_folders(root, module, state, model_name, safe, suffix=""):
    """`<name><suffix>/` per model folder: config.json (when the module can write one) and its weights."""
    for folder, prefix, member in model_folders(module, model_name):
        path = os.path.join(root, folder + suffix)
        os.makedirs(path, exist_ok=True)
        part = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if adapter_keys(member) is not None:  # the adapter alone (adapters.py), its EMA too
            write_adapter(path, member, part, write_tensors)
            continue
        write_config(path, member)
        write_tensors(os.path.join(path, weights_name(member, safe)), part, safe)


def weights_name(module, safe):
    """transformers' name for its models (what its from_pretrained looks for); GigaTrain's (diffusers')
    for every other module, as GigaTrain names them all."""
    if _is_transformers_model(module):
        return "model.safetensors" if safe else "pytorch_model.bin"
    return SAFETENSORS_WEIGHTS_NAME if safe else WEIGHTS_NAME


def write_config(folder, module):
    """config.json: `save_config(folder)` where the module has one (diffusers' ModelMixin; GigaTrain's rule),
    a transformers model's config with `architectures` naming its class; nothing for other modules. A
    save_config that writes no config.json (a LoRA wrapper's, outside fp8 mode) is fine: the weights follow."""
    if hasattr(module, "save_config"):
        module.save_config(folder)
    elif _is_transformers_model(module):
        config = copy.deepcopy(module.config)
        config.architectures = [class_name(module)]
        config.save_pretrained(folder)
    else:
        return
    path = os.path.join(folder, CONFIG)
    if not os.path.isfile(path):  # save_config wrote nothing, or other files (a PEFT adapter's): kept as written
        return
    with open(path) as f:
        saved = json.load(f)
    if saved.get("_class_name") not in (None, class_name(module)):  # FSDP2 renames the class: FSDP<Name>
        saved["_class_name"] = class_name(module)
        with open(path, "w") as f:
            json.dump(saved, f, indent=2, sort_keys=True)


def class_name(module):
    """The module's own class name (FSDP2's fully_shard swaps in a subclass named FSDP<Name>)."""
    cls = next(c for c in type(module).__mro__ if not c.__module__.startswith("torch.distributed."))
    return cls.__name__


def folder_class_name(folder):
    """The class a model folder's config.json names: `_class_name` (diffusers, GigaTrain) or transformers'
    `architectures[0]`; None when the folder has no config.json. A config.json naming none: ValueError."""
    path = os.path.join(folder, CONFIG)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        config = json.load(f)
    name = config.get("_class_name") or (config.get("architectures") or [None])[0]
    if not isinstance(name, str):
        raise ValueError(f"{path}: names no model class (no _class_name, no architectures)")
    return name


def read_weights(checkpoint, meta=None, ema=False):
    """The whole model's state dict (live, or EMA with `ema`) from checkpoint folder `checkpoint` (`meta`:
    its meta.json, read when not given): our GigaTrain layout, its shards (SHARDED_STATE_DICT, read whole), or
    the layout before it (model/, model_ema/)."""
    if meta is None:
        with open(os.path.join(checkpoint, "meta.json")) as f:
            meta = json.load(f)
    layout = meta.get("layout")
    problem = layout_problem(checkpoint, meta)
    if problem is not None:
        raise CorruptCheckpointError(f"{problem}; nothing was loaded", checkpoint)
    if is_sharded(meta):
        return read_dcp_whole(shards_folder(checkpoint, ema), SHARDS_KEY)
    if not isinstance(layout, dict):
        folder = os.path.join(checkpoint, "model_ema" if ema else "model")
        members = not os.path.exists(os.path.join(folder, "model.safetensors")) and \
            not os.path.exists(os.path.join(folder, "model.bin"))
        return load_weights(folder, members=members)
    if not ema and layout["live"] == [LIVE_WITH_EMA]:
        return load_state_dict(os.path.join(checkpoint, LIVE_WITH_EMA))
    state, adapters = {}, layout.get("adapters") or {}
    for folder, prefix in layout["models"].items():
        part = load_state_dict(os.path.join(checkpoint, folder + (EMA_SUFFIX if ema else "")))
        if folder in adapters:  # the adapter only (adapters.py): the base is get_models'
            state.update(model_keys(part, adapters[folder]["keys"], prefix))
            continue
        state.update({prefix + k: v for k, v in part.items()})
    return state


def _is_transformers_model(module):
    """A transformers PreTrainedModel (transformers is imported by then if it is one)."""
    transformers = sys.modules.get("transformers")
    base = getattr(transformers, "PreTrainedModel", None) if transformers is not None else None
    return base is not None and isinstance(module, base)
