"""FSDP (fsdp_version=2, the default): fully_shard per wrap-class block, then the root. Parameters are
DTensors; optimizer state is saved sharded through torch.distributed.checkpoint, the model whole (gathered
on the main rank), or sharded too with fsdp_state_dict_type='SHARDED_STATE_DICT'.
Registered as "FSDP" with FSDP1 (fsdp.py picks by launch.fsdp_config.fsdp_version). A model on the meta
device is sharded as it is and each rank's shard allocated and filled after (meta_start.py)."""
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.tensor import DTensor

from .block_classes import wrap_class_names
from .fp8 import plain_tensors
from ..distributed.env import init_process_group
from .torch_optimizer import TorchOptimizerStrategy


class FSDP2Strategy(TorchOptimizerStrategy):
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
        init_process_group(env)  # also at world size 1: FSDP needs a group
        self.fsdp = launch.fsdp_config
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

    # -- state ----------------------------------------------------------------------------------
    def full_state_dict(self, state):
        """Gathers every sharded (DTensor) tensor: a collective, all ranks call it."""
        state = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu() for k, v in state.items()}
        return plain_tensors(state)

    def model_state_dict(self):
        # cpu_offload on a CPU run makes FSDP1 clone freed unsharded storage (a segfault, torch 2.13)
        options = StateDictOptions(full_state_dict=True, cpu_offload=self.device.type == "cuda")
        return plain_tensors(get_model_state_dict(self.model, options=options))

    def load_model_state(self, state, strict):
        set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True, strict=strict))

    @property
    def sharded_checkpoints(self):
        return self.fsdp.fsdp_state_dict_type == "SHARDED_STATE_DICT"

    def model_shards(self, state=None):
        """DTensors (FSDP1: its sharded state dict) holding this rank's shards only."""
        return plain_tensors(get_model_state_dict(self.model)) if state is None else state

    def load_model_shards(self, folder, strict):
        """Each rank reads the pieces of its own shards (DCP reshards from any world size)."""
        from torch.distributed.checkpoint import DefaultLoadPlanner

        from ..checkpoint.formats.model_layout import SHARDS_KEY
        from ..checkpoint.safe_unpickle import load_dcp
        state = {SHARDS_KEY: plain_tensors(get_model_state_dict(self.model))}  # read into the weights' storage
        load_dcp(state, folder, planner=DefaultLoadPlanner(allow_partial_load=not strict))
        set_model_state_dict(self.model, state[SHARDS_KEY], options=StateDictOptions(strict=strict))

