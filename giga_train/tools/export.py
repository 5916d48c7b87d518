"""`giga-train export CHECKPOINT --to hf [--out DIR] [--ema] [--config CFG] [--max-shard-size 5GB] [--merged]`:
a checkpoint's model as folders that `from_pretrained` opens, whichever strategy and world size wrote it.

The run's own get_models rebuilds the model on the meta device, the checkpoint's whole weights go in, and its
library's save_pretrained writes it (a ModuleDict: one folder per member; a peft.PeftModel: the adapters,
`--merged` adds the merged model, as weights for a base without save_pretrained). Anything else: `giga-train
convert --to full` (docs/checkpoints.md)."""
import inspect
import json
import itertools
import logging
import os
import sys

import torch

from .convert import read_live_weights
from ..checkpoint.out_folder import written_folder
from ..checkpoint.formats.weights import SAFETENSORS_WEIGHTS_NAME, write_tensors
from ..errors import ConfigError
from ..module_dict import ModuleDict

log = logging.getLogger("giga_train")


def export(checkpoint, out=None, ema=False, config=None, max_shard_size="5GB", merged=False):
    """Write the folder(s) and return `out`."""
    weights = read_live_weights(checkpoint, ema)  # refuses an incomplete folder or a missing EMA in one line
    out = out or os.path.normpath(checkpoint) + ("_ema_hf" if ema else "_hf")
    if os.path.exists(out):
        raise ConfigError(f"--out: {out} exists; give another folder (nothing is overwritten)")
    model = rebuilt_model(config or run_config(checkpoint), weights, adapters_only=_adapters_only(checkpoint))
    members = list(model.items()) if isinstance(model, ModuleDict) else [(None, model)]
    for name, module in members:
        _check_exportable(module, name)
    with written_folder(out, "export") as tmp:  # what an interrupted export left is removed first
        for name, module in members:
            save(module, tmp if name is None else os.path.join(tmp, name), max_shard_size, merged)
    return out


def run_config(checkpoint):
    """The config.json that the run saved in its project folder (PROJECT/models/checkpoint_...)."""
    project = os.path.dirname(os.path.dirname(os.path.abspath(checkpoint)))
    path = os.path.join(project, "config.json")
    if not os.path.isfile(path):
        raise ConfigError(f"{checkpoint}: the run's config ({path}) is missing; give it with --config")
    return path


def _adapters_only(checkpoint):
    """Whether the checkpoint holds PEFT adapters only (checkpoint/formats/adapters.py)."""
    with open(os.path.join(checkpoint, "meta.json")) as f:
        return bool((json.load(f).get("layout") or {}).get("adapters"))


def rebuilt_model(config, weights, adapters_only=False):
    """The config's model, built on the meta device, then given `weights` (every key, strictly). A checkpoint
    of PEFT adapters only (`adapters_only`): built on the CPU (get_models loads the frozen base from its
    folder), the adapters given, the base's keys left as built."""
    from .offline import build_model, offline_trainer
    trainer = offline_trainer(config, device="cpu" if adapters_only else "meta")
    try:
        model = build_model(trainer)
    except Exception as e:  # e.g. transformers' from_pretrained refuses the meta device: build it for real
        log.warning("export: get_models failed on the meta device (%s: %s); building the model on the CPU",
                    type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        model = build_model(offline_trainer(config, device="cpu"))
    if any(t.is_meta for t in itertools.chain(model.parameters(), model.buffers())):
        model.to_empty(device="cpu")  # non-persistent buffers stay unset: save_pretrained does not write them
        for module in model.modules():  # to_empty gives tied weights their own storage: tie them again
            if callable(getattr(module, "tie_weights", None)) and hasattr(module, "config"):
                module.tie_weights()
    result = model.load_state_dict(weights, strict=False)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad} | {n for n, _ in model.named_buffers()}
    missing = [k for k in result.missing_keys if k not in _tied_keys(model) and not (adapters_only and k in frozen)]
    if missing or result.unexpected_keys:
        wrong = missing or result.unexpected_keys
        raise ConfigError(f"the checkpoint does not fit the config's model: {len(wrong)} "
                          f"{'missing' if missing else 'unexpected'} keys, e.g. '{wrong[0]}' (give the run's"
                          " config with --config)")
    return model


def _tied_keys(model):
    """Names under which a parameter also appears (tie_weights): loaded through their first name."""
    seen, tied = set(), set()
    for name, p in model.named_parameters(remove_duplicate=False):
        (tied.add(name) if id(p) in seen else seen.add(id(p)))
    return tied


def _peft_model(module):
    peft = sys.modules.get("peft")  # imported by the project's get_models when it made one
    return peft is not None and isinstance(module, peft.PeftModel)


def _check_exportable(module, name):
    if _peft_model(module) or callable(getattr(module, "save_pretrained", None)):
        return
    where = f"models member '{name}'" if name else "the model"
    lora = any("lora_" in key for key in module.state_dict())
    hint = (" its LoRA weights need a peft.PeftModel (get_peft_model) for an adapter export" if lora else "")
    raise ConfigError(f"{where} ({type(module).__name__}) has no save_pretrained (not a transformers, diffusers"
                      f" or PEFT model):{hint or ''} `giga-train convert CHECKPOINT --to full` writes its weights")


def save(module, folder, max_shard_size, merged=False):
    if _peft_model(module):
        module.save_pretrained(folder, safe_serialization=True)  # the adapters only, with adapter_config.json
        if merged:
            base = module.merge_and_unload()
            if callable(getattr(base, "save_pretrained", None)):
                _save_pretrained(base, os.path.join(folder, "merged"), max_shard_size)
            else:  # a plain nn.Module: its merged weights, which its own load_state_dict reads
                os.makedirs(os.path.join(folder, "merged"))
                write_tensors(os.path.join(folder, "merged", SAFETENSORS_WEIGHTS_NAME), base.state_dict())
        return
    _save_pretrained(module, folder, max_shard_size)


def _save_pretrained(module, folder, max_shard_size):
    """The library's own save_pretrained; safetensors (the keyword where the library still takes one)."""
    accepted = inspect.signature(module.save_pretrained).parameters
    kwargs = dict(max_shard_size=max_shard_size)
    if "safe_serialization" in accepted:
        kwargs["safe_serialization"] = True
    with torch.no_grad():
        module.save_pretrained(folder, **kwargs)
