"""DDP: replicated weights, gradients all-reduced once per optimizer step (no_sync while accumulating).
`train.ddp_config` (GigaTrain's key: Accelerate's DistributedDataParallelKwargs) goes to DDP's constructor,
e.g. find_unused_parameters=True for a model with parameters its forward may skip.
With sequence parallelism (launch.parallelism_config sp_size) the replicas are dp_replicate x sp ranks: the
ranks of an SP group hold partial gradients of the same samples, so the all-reduce sums over the SP group
and averages over the data-parallel replicas (one division by dp_replicate_size, not by the world size)."""
import contextlib

import torch.distributed as dist

from torch.nn.parallel import DistributedDataParallel

from ..registry import STRATEGIES
from ..distributed.env import init_process_group
from .torch_optimizer import TorchOptimizerStrategy


@STRATEGIES.register(name="DDP")
class DDPStrategy(TorchOptimizerStrategy):
    PARALLEL_DIMS = ("dp_replicate", "sp")
    FILLS_DIM = "dp_replicate"
    PARALLEL_NOTE = "DDP replicates the weights: shard them with distributed_type='FSDP' (fsdp_version=2)"

    def __init__(self, env, launch, train, **kwargs):
        super().__init__(env, launch, train, **kwargs)
        init_process_group(env)  # also at world size 1: DDP needs a group
        self.build_mesh()

    def setup(self, model, make_optimizer):
        model = model.to(self.device)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.model = DistributedDataParallel(model, device_ids=device_ids, **(self.train.get("ddp_config") or {}))
        if self.mesh is not None and self.mesh.dims.sp > 1:
            self.model.register_comm_hook(self.mesh.data_world_size, _sum_over_sequence_ranks)
        self.optimizer = make_optimizer(model)
        return self.model, self.optimizer

    def unwrap(self):
        return self.model.module

    def accumulating(self, accumulating):
        return self.model.no_sync() if accumulating else contextlib.nullcontext()


def _sum_over_sequence_ranks(data_parallel_size, bucket):
    """DDP's all-reduce of one gradient bucket over every rank, divided by the data-parallel size only."""
    buffer = bucket.buffer()
    buffer.div_(data_parallel_size)
    return dist.all_reduce(buffer, async_op=True).get_future().then(lambda fut: fut.value()[0])


STRATEGIES.register(DDPStrategy, name="MULTI_GPU")
