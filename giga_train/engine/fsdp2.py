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
    PARALLEL_DIMS = ("dp_replicate", "dp_shard", "sp")
    FILLS_DIM = "dp_shard"

    @classmethod
    def parallel_refusal(cls, dims):
        if dims.dp_replicate > 1 and dims.shard_size == 1:
            return (f"dp_replicate_size={dims.dp_replicate} with dp_shard_size x sp_size = 1 shards nothing under"
                    " FSDP: that is DDP (distributed_type='MULTI_GPU')")
        return None

    def __init__(self, env, launch, train, **kwargs):
        super().__init__(env, launch, train, **kwargs)
        self.build_mesh()

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
        mesh = dict(mesh=self.mesh.fsdp_mesh()) if self.mesh is not None else {}
        units = [m for m in model.modules() if type(m).__name__ in wrap_classes]
        for module in units:
            fully_shard(module, mp_policy=policy, reshard_after_forward=reshard, **mesh)
        self.model = fully_shard(model, mp_policy=policy, reshard_after_forward=reshard, **mesh)
        if self.mesh is not None and self.mesh.dims.sp > 1:
            for module in units + [self.model]:
                module.set_gradient_divide_factor(float(self.mesh.data_world_size))
                if self.device.type == "cpu":
                    module.set_force_sum_reduction_for_comms(True)  # the factor is NCCL's PREMUL_SUM: gloo has none
        if meta_start is not None:
            meta_start.fill(self.model, self.device)
        self.optimizer = make_optimizer(self.model)
        return self.model, self.optimizer

    def unwrap(self):
        return self.model

    def model_state_dict(self, keys=None):
        """`keys` (a PEFT adapter's): those tensors alone gathered from their shards, the frozen base left sharded."""
        if keys is None:
            return super().model_state_dict()
        return self.full_state_dict({k: v for k, v in self.model_shards().items() if k in keys})

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
