"""train.loss_normalization='tokens': the trained loss is one big batch's token mean, whatever the
accumulation and the data-parallel ranks. forward_step returns dict(loss_sum=..., num_tokens=...) (the
summed per-token loss of its micro-batch and how many tokens it holds); each micro-batch's backward is of
its sum, the counts add up on the device, and at the optimizer step one collective gives the window's
total over every rank: the gradients (averaged over the ranks by the engine) are multiplied by
ranks / total, before clipping, so they are the gradient of sum(loss_sum) / total (the num_items_in_batch
rule of transformers and Accelerate). No host sync per micro-batch."""
import torch

from ..errors import ConfigError

FORM = "dict(loss_sum=<summed per-token loss>, num_tokens=<its token count>)"


class TokenCount:
    def __init__(self):
        self.count = None  # this step's tokens on this rank (a device tensor)

    def start_step(self):
        self.count = None

    def take(self, losses):
        """The micro-batch's loss sum from forward_step's output (FORM); its count added to this step's."""
        if not isinstance(losses, dict) or set(losses) != {"loss_sum", "num_tokens"}:
            got = sorted(losses) if isinstance(losses, dict) else type(losses).__name__
            raise ConfigError(f"train.loss_normalization='tokens': forward_step must return {FORM}; got {got}")
        loss_sum, tokens = losses["loss_sum"], losses["num_tokens"]
        if loss_sum.dim() != 0:
            raise ConfigError("train.loss_normalization='tokens': loss_sum must be a scalar (the summed loss)")
        tokens = torch.as_tensor(tokens, device=loss_sum.device).detach().to(torch.float64)
        self.count = tokens if self.count is None else self.count + tokens
        return loss_sum

    def factor(self, strategy):
        """ranks / (the step's tokens over every rank): one collective, a device tensor (float32)."""
        ranks = strategy.data_world_size
        if ranks != strategy.env.world_size:
            raise ConfigError("train.loss_normalization='tokens': only data parallelism (no tensor, sequence or"
                              " pipeline ranks)")
        total = strategy.reduce_mean(self.count) * strategy.env.world_size
        return (ranks / total).float()


def scale_gradients(module, factor):
    """Multiply every gradient of `module` by `factor` (a device scalar) in place; a DTensor's local shard."""
    for p in module.parameters():
        if p.grad is not None:
            grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            grad.mul_(factor.to(grad.dtype))
