"""FSDP with fsdp_version=1: FullyShardedDataParallel with the same wrap classes as FSDP2 (use_orig_params).
Its sharded optimizer state does not reload through DCP (torch 2.13): it is checkpointed whole."""
import contextlib

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions

from .block_classes import wrap_class_names
from ..errors import ConfigError
from .fsdp2 import FSDP2Strategy


class FSDP1Strategy(FSDP2Strategy):
    starts_from_meta = False  # FullyShardedDataParallel would need param_init_fn and sync_module_states
    PARALLEL_DIMS = ("dp_shard",)
    PARALLEL_NOTE = "use fsdp_version=2 (FSDP2 takes dp_replicate x dp_shard x sp)"

    @classmethod
    def parallel_refusal(cls, dims):
        return None

    def gathers_float8_weights(self):
        return False

    def setup(self, model, make_optimizer):
        from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        if self.train.with_ema:
            raise ConfigError("train.with_ema: not available with fsdp_version=1 (use fsdp_version=2)")
        dtype = self.precision.dtype
        wrap_classes = wrap_class_names(model, self.fsdp)
        classes = {type(m) for m in model.modules() if type(m).__name__ in wrap_classes}
        self.model = FullyShardedDataParallel(
            model, auto_wrap_policy=ModuleWrapPolicy(classes) if classes else None, use_orig_params=True,
            mixed_precision=MixedPrecision(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else None,
            device_id=self.device)
        self.optimizer = make_optimizer(self.model)
        for opt in getattr(self.optimizer, "optimizers", [self.optimizer]):  # an OptimizerGroup holds several
            refusal = getattr(type(opt), "FSDP1_REFUSAL", None)
            if refusal:  # a trainer's own get_optimizers can reach here past `check`
                raise ConfigError(f"optimizer {type(opt).__name__}: {refusal}")
        return self.model, self.optimizer

    def unwrap(self):
        return self.model.module

    def accumulating(self, accumulating):
        return self.model.no_sync() if accumulating else contextlib.nullcontext()

    def clip_grad_norm(self, max_norm):
        return self.model.clip_grad_norm_(max_norm if max_norm is not None else float("inf"), self.norm_type)

    def optimizer_state_options(self):
        return StateDictOptions(full_state_dict=True, cpu_offload=self.device.type == "cuda")
