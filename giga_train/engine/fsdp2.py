"""FSDP (fsdp_version=2, the default): fully_shard per wrap-class block, then the root. Parameters are
DTensors; optimizer state is saved sharded through torch.distributed.checkpoint, the model as fsdp_base.py
says.
Registered as "FSDP" with FSDP1 (fsdp.py picks by launch.fsdp_config.fsdp_version). A model on the meta
device is sharded as it is and each rank's shard allocated and filled after (meta_start.py)."""
import torch
from torch.distributed.tensor import DTensor

from .block_classes import wrap_class_names
from .fsdp_base import FSDPStrategyBase


class FSDP2Strategy(FSDPStrategyBase):
    starts_from_meta = True

    def gathers_float8_weights(self):
        return True  # parameters become DTensors: torchao all-gathers float8 weights (tensorwise)

    def setup(self, model, make_optimizer, meta_start=None):
        """`meta_start` (a MetaStart): the model is on the meta device; each rank's shard is filled after."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        wrap_classes = wrap_class_names(model, self.fsdp)
        if meta_start is None:
            model.to(self.device)
        dtype = self.precision.dtype
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else \
            MixedPrecisionPolicy()
        reshard = self.fsdp.fsdp_reshard_after_forward
        for module in model.modules():
            if type(module).__name__ in wrap_classes:
                fully_shard(module, mp_policy=policy, reshard_after_forward=reshard)
        self.model = fully_shard(model, mp_policy=policy, reshard_after_forward=reshard)
        if meta_start is not None:
            meta_start.fill(self.model, self.device)
        self.optimizer = make_optimizer(self.model)
        return self.model, self.optimizer

    def unwrap(self):
        return self.model

    def accumulating(self, accumulating):
        self.model.set_requires_gradient_sync(not accumulating)
        return super().accumulating(accumulating)

    def clip_grad_norm(self, max_norm):
        params = [p for p in self.model.parameters() if p.grad is not None]
        if max_norm is None:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params], self.norm_type)
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm, self.norm_type)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm
