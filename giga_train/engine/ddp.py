"""DDP: replicated weights, gradients all-reduced once per optimizer step (no_sync while accumulating).
`train.ddp_config` (GigaTrain's key: Accelerate's DistributedDataParallelKwargs) goes to DDP's constructor,
e.g. find_unused_parameters=True for a model with parameters its forward may skip."""
import contextlib

from torch.nn.parallel import DistributedDataParallel

from ..registry import STRATEGIES
from ..distributed.env import init_process_group
from .torch_optimizer import TorchOptimizerStrategy


@STRATEGIES.register(name="DDP")
class DDPStrategy(TorchOptimizerStrategy):
    def __init__(self, env, launch, train, **kwargs):
        super().__init__(env, launch, train, **kwargs)
        init_process_group(env)  # also at world size 1: DDP needs a group

    def setup(self, model, make_optimizer):
        model = model.to(self.device)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.model = DistributedDataParallel(model, device_ids=device_ids, **(self.train.get("ddp_config") or {}))
        self.optimizer = make_optimizer(model)
        return self.model, self.optimizer

    def unwrap(self):
        return self.model.module

    def accumulating(self, accumulating):
        return self.model.no_sync() if accumulating else contextlib.nullcontext()


STRATEGIES.register(DDPStrategy, name="MULTI_GPU")
