"""FSDP: fully_shard per wrap-class block, then the root (fsdp_version=2); FullyShardedDataParallel with
the same wrap policy (fsdp_version=1). Optimizer state is saved sharded through torch.distributed.checkpoint;
the model is also written whole, as in every strategy."""
import contextlib

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.tensor import DTensor

from ...checkpoint.state import load_weights
from ...config import Config, ConfigError
from ...fp8 import plain_tensors
from ...module_dict import ModuleDict
from ...registry import STRATEGIES
from ...schema import FSDP
from ..env import init_process_group
from .base import Strategy


def wrap_class_names(fsdp_config, model):
    names = fsdp_config.fsdp_transformer_layer_cls_to_wrap
    if fsdp_config.fsdp_auto_wrap_policy == "NO_WRAP" or not names:
        return []
    names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
    present = sorted({type(m).__name__ for m in model.modules()})
    missing = [n for n in names if n not in present]
    if missing:
        raise ConfigError(f"launch.fsdp_config.fsdp_transformer_layer_cls_to_wrap: no module of class"
                          f" '{missing[0]}' in the model (classes present: {', '.join(present)})")
    return names


@STRATEGIES.register(name="FSDP")
class FSDPStrategy(Strategy):
    def __init__(self, env, launch, train, **kwargs):
        super().__init__(env, launch, train, **kwargs)
        init_process_group(env)  # also at world size 1: FSDP needs a group
        self.fsdp = launch.fsdp_config or Config({k: v.default for k, v in FSDP.items()})
        self.version = self.fsdp.fsdp_version
        if self.version == 1:  # FSDP1's sharded optimizer state does not reload through DCP (torch 2.13)
            self.optimizer_options = StateDictOptions(full_state_dict=True, cpu_offload=env.device.type == "cuda")

    @property
    def shards_parameters_as_dtensors(self):
        return self.version == 2

    def setup(self, model, make_optimizer):
        if self.version == 1 and self.train.with_ema:
            raise ConfigError("train.with_ema: not available with fsdp_version=1 (use fsdp_version=2)")
        names = wrap_class_names(self.fsdp, model)
        dtype = self.precision.dtype
        if self.version == 2:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
            model.to(self.device)
            policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else \
                MixedPrecisionPolicy()
            reshard = self.fsdp.fsdp_reshard_after_forward
            for module in model.modules():
                if type(module).__name__ in names:
                    fully_shard(module, mp_policy=policy, reshard_after_forward=reshard)
            self.model = fully_shard(model, mp_policy=policy, reshard_after_forward=reshard)
        else:
            from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy
            classes = {type(m) for m in model.modules() if type(m).__name__ in names}
            self.model = FullyShardedDataParallel(
                model, auto_wrap_policy=ModuleWrapPolicy(classes) if classes else None, use_orig_params=True,
                mixed_precision=MixedPrecision(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else None,
                device_id=self.device)
        self.optimizer = make_optimizer(self.model)
        return self.model, self.optimizer

    def unwrap(self):
        return self.model if self.version == 2 else self.model.module

    def accumulating(self, accumulating):
        if self.version == 2:
            self.model.set_requires_gradient_sync(not accumulating)
            return contextlib.nullcontext()
        return self.model.no_sync() if accumulating else contextlib.nullcontext()

    def clip_grad_norm(self, max_norm):
        if self.version == 1:
            return self.model.clip_grad_norm_(max_norm if max_norm is not None else float("inf"))
        params = [p for p in self.model.parameters() if p.grad is not None]
        if max_norm is None:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    # -- state --------------------------------------------------------------------------------
    def full_state_dict(self, state):
        """Gathers every sharded (DTensor) tensor: a collective, all ranks call it."""
        state = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu() for k, v in state.items()}
        return plain_tensors(state)

    def model_state_dict(self):
        # cpu_offload on a CPU run makes FSDP1 clone freed unsharded storage (a segfault, torch 2.13)
        options = StateDictOptions(full_state_dict=True, cpu_offload=self.device.type == "cuda")
        return plain_tensors(get_model_state_dict(self.model, options=options))

    def load_model(self, folder, strict):
        state = load_weights(folder, members=isinstance(self.unwrap(), ModuleDict))
        set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True, strict=strict))
        return [], []
