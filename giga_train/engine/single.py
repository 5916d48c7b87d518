"""NO: one process, the model on one device (a GPU or the CPU)."""
from ..registry import STRATEGIES
from .torch_optimizer import TorchOptimizerStrategy


@STRATEGIES.register(name="NO")
class SingleProcessStrategy(TorchOptimizerStrategy):
    def setup(self, model, make_optimizer):
        self.model = model.to(self.device)
        self.optimizer = make_optimizer(self.model)
        return self.model, self.optimizer

    def unwrap(self):
        return self.model
