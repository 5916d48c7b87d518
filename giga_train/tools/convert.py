"""`giga-train convert CHECKPOINT --to full|dcp [--out DIR]`: a checkpoint's model and optimizer state
as plain files, whichever strategy and world size wrote it.

- full: `model.safetensors` (the whole model; ModuleDict members as `member.` prefixes, so that
  get_models(...).load_state_dict reads it) and `optimizer.pt` (the optimizer state keyed by
  parameter name: torch.distributed.checkpoint.state_dict's full form);
- dcp: one torch.distributed.checkpoint folder holding {"model", "optimizer"} in that form.
Weights are the fp32 ones (DeepSpeed's master weights where DeepSpeed wrote the checkpoint).
Every strategy resumes from the checkpoint folder itself; this is for users who want the files."""
import os

import torch

from ..errors import ConfigError
from ..checkpoint.formats.model_layout import read_weights as layout_weights
from ..checkpoint.manager import check_intact, is_complete, read_meta
from ..checkpoint.out_folder import written_folder
from ..checkpoint.formats.weights import save_weights


def convert(checkpoint, to, out=None):
    if not is_complete(checkpoint):
        raise ConfigError(f"{checkpoint}: not a complete checkpoint folder (no meta.json)")
    if to not in ("full", "dcp"):
        raise ConfigError(f"--to: '{to}' is not one of full, dcp")
    out = out or os.path.normpath(checkpoint) + f"_{to}"
    if os.path.exists(out):
        raise ConfigError(f"--out: {out} exists; give another folder (nothing is overwritten)")
    weights, optimizer = read_state(checkpoint)
    with written_folder(out, "convert") as tmp:
        if to == "full":
            save_weights(tmp, weights)  # one model.safetensors, ModuleDict members as prefixes
            torch.save(optimizer, os.path.join(tmp, "optimizer.pt"))
        else:
            import torch.distributed.checkpoint as dcp
            dcp.save({"model": weights, "optimizer": optimizer}, checkpoint_id=tmp, no_dist=True)
    return out


def read_state(checkpoint):
    """(whole fp32 weights, full optimizer state dict keyed by parameter name) of a checkpoint (verified
    by read_weights)."""
    from ..checkpoint.formats.full_state import (deepspeed_meta, deepspeed_parameters, deepspeed_ties, read_dcp,
                                                 read_deepspeed)
    weights = read_weights(checkpoint)
    if deepspeed_meta(checkpoint) is None:
        return weights, read_dcp(checkpoint)
    fp32, optimizer = read_deepspeed(checkpoint, *deepspeed_parameters(checkpoint))
    if fp32:
        fp32.update({later: fp32[first] for later, first in deepspeed_ties(checkpoint).items() if first in fp32})
        weights.update(fp32)
    return weights, optimizer


def read_live_weights(checkpoint, ema=False):
    """read_weights, except that where DeepSpeed wrote the checkpoint the trained weights are its fp32
    masters (its model folders hold them in the engine's dtype, bf16/fp16 under mixed precision, as
    GigaTrain's do); the EMA's are read as written."""
    from ..checkpoint.formats.full_state import deepspeed_meta
    if ema or deepspeed_meta(checkpoint) is None:
        return read_weights(checkpoint, ema)
    return read_state(checkpoint)[0]


def read_weights(checkpoint, ema=False):
    """The whole model state dict of a checkpoint written by any strategy (`ema`: the moving average's), as
    its model folders (or with SHARDED_STATE_DICT the model's shards) hold it: no engine state is read
    (DeepSpeed's fp32 masters: read_live_weights)."""
    if not is_complete(checkpoint):
        raise ConfigError(f"{checkpoint}: not a complete checkpoint folder (no meta.json)")
    check_intact(checkpoint)  # checksums and layout, as resume: one line naming a damaged file
    meta = read_meta(checkpoint)
    if ema and not meta.get("ema"):
        raise ConfigError(f"{checkpoint}: no EMA weights (the run had train.with_ema off)")
    return layout_weights(checkpoint, meta, ema=ema)
