"""Reading a checkpoint folder that the real GigaTrain 1.1 wrote (Accelerate's save_state, one process or
DDP) into the state our loader takes, so that `train.resume` continues a GigaTrain run under giga-train.

Every pickle is read through the allow-list (safe_unpickle); the positional optimizer state is matched to our
parameters by position and shape, GigaTrain's CAME8Bit moment re-encoded in our code map, and the data
position derived from the step (docs/checkpoints.md, "Moving a GigaTrain 1.1 run over"; the folder:
docs/GIGATRAIN.md section 12.1)."""
import glob
import json
import logging
import os
from dataclasses import dataclass

import torch

from ..errors import ConfigError, CorruptCheckpointError
from ..checkpoint.manager import NAME, is_complete
from ..checkpoint.safe_unpickle import numpy_array_globals, torch_load

log = logging.getLogger("giga_train")

TRAINER_STATE, EMA_CONFIG, SCALER = "custom_checkpoint_0.pkl", "ema_config.json", "scaler.pt"
MARKERS = (TRAINER_STATE, "random_states_0.pkl", "optimizer.bin", "scheduler.bin")
ACCELERATE_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
FOLDER_WEIGHTS = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")
# Accelerate's files under FSDP (sharded state) and DeepSpeed: another layout, not read here.
SHARDED = ("pytorch_model_fsdp_0", "optimizer_0", "pytorch_model_fsdp.bin", "pytorch_model")
CAME_MATRIX_STATS = ("exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_res_row", "exp_avg_res_col")


@dataclass
class GigaTrainState:
    """What a GigaTrain checkpoint continues with, in our in-memory forms."""
    folder: str
    weights: dict              # full model state dict, our unwrapped module's keys
    optimizer: dict            # full optimizer state keyed by parameter name (checkpoint/formats/full_state.py's form)
    training_state: dict       # the trainer's load_state_dict input: schedulers, data position, step
    ema_weights: dict = None   # the average, full state dict keys; None when the folder holds none
    ema_step: int = None
    rng: dict = None           # state.set_rng_state's form; None when the file is missing or refused
    precision: dict = None     # Precision.load_state_dict's form (fp16's loss scaler, Accelerate's scaler.pt)


def is_gigatrain_checkpoint(folder):
    """A folder Accelerate's save_state wrote for GigaTrain (ours always ends with meta.json)."""
    return os.path.isdir(folder) and not is_complete(folder) and \
        any(os.path.isfile(os.path.join(folder, name)) for name in MARKERS)


def latest_gigatrain_checkpoint(model_dir):
    """The GigaTrain checkpoint of the highest step under `model_dir`, or None."""
    found = []
    for path in glob.glob(os.path.join(model_dir, "checkpoint_epoch_*_step_*")):
        match = NAME.match(os.path.basename(path))
        if match and is_gigatrain_checkpoint(path):
            found.append((int(match.group(2)), path))
    return max(found)[1] if found else None


def read_gigatrain_checkpoint(folder, layout, optimizers, members=None, rank=0, data_position=None):
    """Read `folder` (is_gigatrain_checkpoint) into a GigaTrainState.

    `layout`: (names with shapes in the engine optimizer's order, its param groups): Strategy.optimizer_layout();
    `optimizers`: the trainer's optimizers (which one steps which groups; CAME8Bit's block layout);
    `members`: the ModuleDict's member names, None for a plain module; `rank`: whose RNG file to read;
    `data_position(step)`: the data stream's state after `step` optimizer steps."""
    for name in SHARDED:
        if os.path.exists(os.path.join(folder, name)):
            raise ConfigError(f"train.resume: {os.path.join(folder, name)}: a GigaTrain checkpoint written under"
                              " FSDP or DeepSpeed; giga-train reads GigaTrain's NO/DDP checkpoints (one optimizer.bin"
                              " per optimizer)")
    step = int(_load(folder, TRAINER_STATE)["step"])
    names, groups = layout
    schedulers = _numbered(folder, "scheduler")
    if not schedulers:  # GigaTrain builds one scheduler per optimizer, and Accelerate saves each
        _load(folder, "scheduler.bin")  # the one line saying it is missing
    training_state = dict(step=step, schedulers=schedulers,
                          data=data_position(step) if data_position is not None else None)
    ema_weights, ema_step = _read_ema(folder, members)
    return GigaTrainState(folder=folder, weights=_read_weights(folder, members),
                          optimizer=_read_optimizers(folder, names, groups, optimizers),
                          training_state=training_state, ema_weights=ema_weights, ema_step=ema_step,
                          rng=_read_rng(folder, rank), precision=_read_scaler(folder))


# -- files --------------------------------------------------------------------------------------------
def _load(folder, name, **kwargs):
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        raise CorruptCheckpointError(f"train.resume: {path}: missing (GigaTrain writes it into every checkpoint)")
    try:
        return torch_load(path, **kwargs)  # the allow-list: UnsafeCheckpointError names the file and object
    except (RuntimeError, EOFError, OSError, ValueError) as e:  # truncated, not a torch file
        raise CorruptCheckpointError(f"train.resume: {path}: not a readable checkpoint file"
                                     f" ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None


def _numbered(folder, stem):
    """Accelerate's `stem.bin`, `stem_1.bin`, ... in order, read."""
    found, i = [], 0
    while True:
        name = f"{stem}.bin" if i == 0 else f"{stem}_{i}.bin"
        if not os.path.isfile(os.path.join(folder, name)):
            return found
        found.append(_load(folder, name))
        i += 1


def _weights_file(path):
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file
        try:
            return load_file(path)
        except Exception as e:  # safetensors' own errors: one line naming the file
            raise CorruptCheckpointError(f"train.resume: {path}: not a readable safetensors file"
                                         f" ({type(e).__name__})") from None
    return _load(os.path.dirname(path), os.path.basename(path))


def _folder_weights(folder):
    for name in FOLDER_WEIGHTS:
        if os.path.isfile(os.path.join(folder, name)):
            return _weights_file(os.path.join(folder, name))
    raise ConfigError(f"train.resume: {folder}: no {' or '.join(FOLDER_WEIGHTS)}")


def _member_folders(folder, members, suffix=""):
    """{member: its folder} (members None: the plain module's `model{suffix}/`)."""
    if members is None:
        return {"": os.path.join(folder, "model" + suffix)}
    return {m: os.path.join(folder, m + suffix) for m in members}


def _read_weights(folder, members):
    """The live weights: Accelerate's root file when GigaTrain had EMA, else the member folders."""
    for name in ACCELERATE_WEIGHTS:
        if os.path.isfile(os.path.join(folder, name)):
            return _weights_file(os.path.join(folder, name))
    weights = {}
    for member, path in _member_folders(folder, members).items():
        if not os.path.isdir(path):
            raise ConfigError(f"train.resume: {path}: missing; the GigaTrain checkpoint has no weights for"
                              f" {'member ' + repr(member) if member else 'the model'} (nor {ACCELERATE_WEIGHTS[0]})")
        prefix = member + "." if member else ""
        weights.update({prefix + k: v for k, v in _folder_weights(path).items()})
    return weights


def _read_ema(folder, members):
    folders = _member_folders(folder, members, "_ema")
    if not all(os.path.isdir(path) for path in folders.values()):
        return None, None
    weights = {}
    for member, path in folders.items():
        weights.update({(member + "." if member else "") + k: v for k, v in _folder_weights(path).items()})
    step = None
    config = os.path.join(folder, EMA_CONFIG)
    if os.path.isfile(config):
        with open(config) as f:
            step = json.load(f).get("optimization_step")
    return weights, step


def _read_rng(folder, rank):
    """Accelerate's RNG file of this rank in state.set_rng_state's form; None (said in one line) when it is
    missing or holds more than the allow-list reads."""
    name = f"random_states_{rank}.pkl"
    try:
        saved = _load(folder, name, extra_globals=numpy_array_globals())
        version, internal, gauss = saved["random_state"]
        kind, keys, pos, has_gauss, cached = saved["numpy_random_seed"]
        state = dict(python=(version, tuple(internal), gauss), torch=saved["torch_manual_seed"],
                     numpy=(kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached)))
        if "torch_cuda_manual_seed" in saved:  # a GPU run: every device's generator
            state["cuda"] = saved["torch_cuda_manual_seed"]
    except Exception as e:  # the RNG is not worth failing the resume for; weights and optimizer are
        log.warning("resume: %s: the random states are not restored (%s); they continue from this run's seed",
                    os.path.join(folder, name), str(e).splitlines()[0] if str(e) else type(e).__name__)
        return None
    return state


def _read_scaler(folder):
    if not os.path.isfile(os.path.join(folder, SCALER)):
        return None
    return dict(scaler=_load(folder, SCALER))


# -- optimizer state ----------------------------------------------------------------------------------
def _read_optimizers(folder, names, groups, optimizers):
    saved = _numbered(folder, "optimizer")
    if not saved:
        log.warning("resume: %s holds no optimizer.bin (GigaTrain's checkpoint_save_optimizer=False dropped it);"
                    " the optimizer starts afresh", folder)
        return None
    files = ["optimizer.bin" if i == 0 else f"optimizer_{i}.bin" for i in range(len(saved))]
    saved_groups = [(file, g, opt["state"]) for file, opt in zip(files, saved) for g in opt["param_groups"]]
    total = sum(len(g["params"]) for _, g, _ in saved_groups)
    if len(saved_groups) != len(groups) or total != len(names):
        raise ConfigError(f"train.resume: {os.path.join(folder, files[0])}: GigaTrain's {len(saved)} optimizer file(s)"
                          f" hold {len(saved_groups)} param group(s) of {total} parameters, this run's optimizers"
                          f" {len(groups)} of {len(names)}: the models or get_optimizers differ from the GigaTrain run")
    came = _came_settings(optimizers, groups)
    order, state, out_groups = iter(names), {}, []
    for gi, ((file, saved_group, saved_state), ours) in enumerate(zip(saved_groups, groups)):
        group_names = []
        for index in saved_group["params"]:
            name, shape = next(order)
            group_names.append(name)
            if index in saved_state:
                where = f"{os.path.join(folder, file)}: parameter {index} ({name}, shape {list(shape)})"
                state[name] = _convert(saved_state[index], shape, came.get(gi), where)
        # our group's keys, with GigaTrain's values (its lr is the one its scheduler last set)
        out_groups.append(dict({k: saved_group.get(k, v) for k, v in ours.items() if k != "params"},
                               params=group_names))
    return dict(state=state, param_groups=out_groups)


def _came_settings(optimizers, groups):
    """{group index: (block_size, min_8bit_size)} of the groups our CAME8Bit steps."""
    from ..optimizers.came_8bit import CAME8Bit
    found, gi = {}, 0
    for optimizer in optimizers:
        for _ in optimizer.param_groups:
            if isinstance(optimizer, CAME8Bit):
                found[gi] = (optimizer.block_size, optimizer.min_8bit_size)
            gi += 1
    return found if gi == len(groups) else {}


def _is_gigatrain_came(entry):
    return "RMS" in entry and ("exp_avg_sq_row" in entry or "exp_avg_sq" in entry)


def _convert(entry, shape, came, where):
    """One parameter's saved state in our optimizer's form, shapes checked."""
    if _is_gigatrain_came(entry) != (came is not None):
        theirs, ours = ("CAME8Bit", "another optimizer") if came is None else ("another optimizer", "CAME8Bit")
        raise ConfigError(f"train.resume: {where}: GigaTrain stepped it with {theirs}, this run with {ours}:"
                          " give the optimizer the GigaTrain run had")
    if came is not None:
        return _came_state(entry, shape, came, where)
    out = {}
    for key, value in entry.items():
        if torch.is_tensor(value) and value.dim() > 0 and tuple(value.shape) != tuple(shape):
            raise ConfigError(f"train.resume: {where}: its '{key}' has shape {list(value.shape)}: the models or"
                              " get_optimizers differ from the GigaTrain run")
        out[key] = value
    return out


def _decode_gigatrain(value, shape, where, key):
    """GigaTrain's CAME8Bit 8-bit value (blocks of rows: {data, scale, min}), or its fp32 tensor, in fp32."""
    if isinstance(value, list):
        value = torch.cat([block["data"].float() * block["scale"] + block["min"] for block in value])
    if not torch.is_tensor(value) or value.numel() != torch.Size(shape).numel():
        raise ConfigError(f"train.resume: {where}: its '{key}' does not fit the parameter: the models or"
                          " get_optimizers differ from the GigaTrain run")
    return value.float().reshape(shape)


def _came_state(entry, shape, came, where):
    """GigaTrain's CAME8Bit state of one parameter as our CAME8Bit holds it (came_torch.init_state's layout)."""
    from ..optimizers.came_zero import whole_state_from_full
    from ..optimizers.kernels.came_torch import factored_view_shape
    full = dict(step=torch.tensor(float(entry["step"])), RMS=torch.as_tensor(entry.get("RMS", 0.0)).float().reshape(()),
                exp_avg=_decode_gigatrain(entry["exp_avg"], shape, where, "exp_avg"))
    fshape = factored_view_shape(shape)
    if "exp_avg_sq_row" in entry:  # a matrix or 1x1 conv: factored in both, fp32 in both
        full.update({k: entry[k].float() for k in CAME_MATRIX_STATS})
    elif fshape is None:
        full["exp_avg_sq"] = _decode_gigatrain(entry["exp_avg_sq"], shape, where, "exp_avg_sq")
    else:
        # GigaTrain keeps a whole second moment for convolutions wider than 1x1, ours its row and column
        # factors: the factors are the whole moment's means (exact: means commute with the running average);
        # the residual factors GigaTrain has no counterpart of start from zero.
        v = _decode_gigatrain(entry["exp_avg_sq"], shape, where, "exp_avg_sq").reshape(fshape)
        full.update(exp_avg_sq_row=v.mean(dim=-1), exp_avg_sq_col=v.mean(dim=-2))
        log.info("resume: %s: GigaTrain's whole second moment becomes our row/column factors; the residual"
                 " factors start from zero", where)
    block_size, min_8bit_size = came
    return whole_state_from_full(full, torch.empty(shape), block_size, min_8bit_size)


__all__ = ["GigaTrainState", "is_gigatrain_checkpoint", "latest_gigatrain_checkpoint", "read_gigatrain_checkpoint"]
