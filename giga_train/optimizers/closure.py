"""torch.optim's closure convention for `step(closure=None)`, shared by our optimizers."""
import torch


def closure_loss(closure):
    """The loss `closure` returns, run with gradients enabled (step itself runs under no_grad); None without one."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()
