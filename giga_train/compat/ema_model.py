"""GigaTrain's EMAModel (`from giga_train import EMAModel`), over a whole state dict, with its decay
warmup: decay_t = min((1 + s) / (10 + s), decay) with s = t - update_after_step - 1, which is
0 at the first update (so that update copies the weights). save_ema averages saved checkpoints."""
import functools
import json
import operator
from collections import OrderedDict

import torch
import torch.distributed as dist


def warmup_decay(step, decay, min_decay=0.0, update_after_step=0, use_ema_warmup=False, inv_gamma=1.0,
                 power=2 / 3):
    """The decay GigaTrain's EMAModel uses at optimization step `step` (counted from 1)."""
    s = max(0, step - update_after_step - 1)
    if s <= 0:
        return 0.0
    value = 1 - (1 + s / inv_gamma) ** -power if use_ema_warmup else (1 + s) / (10 + s)
    return max(min(value, decay), min_decay)


def _is_buffer(name, value):
    """Entries EMAModel keeps as they are instead of averaging: non-tensors, empty tensors, extra state."""
    return not isinstance(value, torch.Tensor) or value.numel() == 0 or name.endswith("_extra_state")


class EMAModel:
    """GigaTrain's EMAModel: an average over a whole model state dict (buffers included), each rank
    keeping a 1/world_size slice of every flattened tensor.

        ema = EMAModel(decay=0.9999, rank=rank, world_size=world_size)
        ema.load_state_dict(model.state_dict(), device=device)   # start from the weights
        ema.step(model.state_dict())                            # after each optimizer step
        averaged = ema.state_dict()                              # gathered onto every rank (CPU)

    decay at update t: warmup_decay(t, ...); with use_ema_warmup, 1 - (1 + s / inv_gamma) ** -power."""

    def __init__(self, decay=0.9999, min_decay=0.0, optimization_step=0, update_after_step=0,
                 use_ema_warmup=False, inv_gamma=1.0, power=2 / 3, rank=0, world_size=1):
        if world_size > 1 and (rank != dist.get_rank() or world_size != dist.get_world_size()):
            raise ValueError(f"EMAModel: rank {rank} / world_size {world_size} differ from the process group's "
                             f"{dist.get_rank()} / {dist.get_world_size()}")
        self.decay, self.min_decay = decay, min_decay
        self.optimization_step, self.update_after_step = optimization_step, update_after_step
        self.use_ema_warmup, self.inv_gamma, self.power = use_ema_warmup, inv_gamma, power
        self.rank, self.world_size = rank, world_size
        self._param_dict, self._shape_dict, self._slice_dict = OrderedDict(), OrderedDict(), OrderedDict()
        self._buffer_dict = OrderedDict()

    def get_decay(self, optimization_step) -> float:
        return warmup_decay(optimization_step, self.decay, self.min_decay, self.update_after_step,
                            self.use_ema_warmup, self.inv_gamma, self.power)

    def _local(self, param):
        """This rank's slice of the flattened tensor, zero-padded to a multiple of world_size."""
        flat = param.reshape(-1)
        pad = (self.world_size - flat.numel() % self.world_size) % self.world_size
        if pad:
            flat = torch.nn.functional.pad(flat, [0, pad])
        size = flat.numel() // self.world_size
        begin = self.rank * size
        return flat[begin:begin + size], (begin, begin + size)

    @torch.no_grad()
    def step(self, state_dict) -> None:
        """One update towards `state_dict` (the full weights, the same names as loaded)."""
        self.optimization_step += 1
        decay = self.get_decay(self.optimization_step)
        for name, param in state_dict.items():
            if _is_buffer(name, param):
                if name not in self._buffer_dict:
                    raise KeyError(f"EMAModel.step: '{name}' was not in the state dict it was loaded with")
                if isinstance(param, torch.Tensor) and param.numel() == 0:
                    continue
                self._buffer_dict[name] = param
                continue
            shard = self._param_dict[name]
            local, _ = self._local(param)
            shard[:] = (shard.float() * decay + local.float() * (1 - decay)).to(shard.dtype)

    def load_state_dict(self, state_dict, device=None, dtype=None) -> None:
        """Start (or restart) the average from `state_dict`: this rank's slices, on `device` in `dtype`."""
        self._param_dict, self._shape_dict, self._slice_dict = OrderedDict(), OrderedDict(), OrderedDict()
        for name, param in state_dict.items():
            if _is_buffer(name, param):
                self._buffer_dict[name] = param
                continue
            self._shape_dict[name] = param.shape
            local, bounds = self._local(param)
            local = local.clone()
            if device is not None:
                local = local.to(device)
            if dtype is not None:
                local = local.to(dtype)
            self._param_dict[name] = local
            self._slice_dict[name] = bounds

    def state_dict(self, device=None, dtype=None) -> dict:
        """The whole averaged state dict (all-gathered across ranks; on the CPU unless `device`)."""
        out = OrderedDict()
        for name, shard in self._param_dict.items():
            shape = self._shape_dict[name]
            if self.world_size > 1:
                pieces = [torch.empty_like(shard) for _ in range(self.world_size)]
                dist.all_gather(pieces, shard)
                numel = functools.reduce(operator.mul, shape, 1)
                param = torch.cat(pieces)[:numel].reshape(shape)
            else:
                param = shard.reshape(shape)
            param = param.to(device) if device is not None else param.cpu()
            if dtype is not None:
                param = param.to(dtype)
            out[name] = param
        out.update(self._buffer_dict)
        return out

    @property
    def config(self) -> dict:
        return dict(decay=self.decay, min_decay=self.min_decay, optimization_step=self.optimization_step,
                    update_after_step=self.update_after_step, use_ema_warmup=self.use_ema_warmup,
                    inv_gamma=self.inv_gamma, power=self.power)

    @classmethod
    def from_config(cls, config):
        """From a config dict or the path of an ema_config.json."""
        if not isinstance(config, dict):
            with open(config) as f:
                config = json.load(f)
        return cls(**config)

    def save_config(self, save_path) -> None:
        """Write ema_config.json (GigaTrain's checkpoint file beside the `<name>_ema` folders)."""
        with open(save_path, "w", encoding="utf-8") as f:
            f.write(json.dumps(self.config, indent=2, sort_keys=True) + "\n")

    def load_config(self, config) -> None:
        if not isinstance(config, dict):
            with open(config) as f:
                config = json.load(f)
        for key, value in config.items():
            setattr(self, key, value)


def save_ema(ckpt_paths, save_path, decay=0.9):
    """Average saved weights (files or model folders, oldest first) with a fixed `decay`, in fp32,
    and save the result in the first one's dtype."""
    from .utils import load_state_dict, save_state_dict
    average, dtype = None, None
    for path in ckpt_paths:
        state = load_state_dict(path)
        if average is None:
            dtype = next(iter(state.values())).dtype
            average = {name: value.float() for name, value in state.items()}
        else:
            for name, value in state.items():
                average[name] = average[name] * decay + value.float() * (1 - decay)
    save_state_dict({name: value.to(dtype) for name, value in average.items()}, save_path)
