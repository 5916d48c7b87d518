"""The training log's losses: each step's (summed over its micro-batches on the device), and their sums
since the last log line over the steps that were applied. A skipped step's losses are left out, so one
NaN does not hide the others': masked on the device by its flag where the skip was decided there. With
train.loss_normalization='tokens' the micro-batches' loss sums are kept, and scaled to the token mean at
the step (token_normalization.py)."""
import torch

from ..errors import ConfigError
from .loss_forms import refuse_model_output, refuse_non_losses
from .token_normalization import FORM, TokenCount, scale_gradients


class LossBook:
    def __init__(self, accumulation, normalization="mean"):
        self.tokens = TokenCount() if normalization == "tokens" else None
        # what a micro-batch's loss is divided by in its backward and the log: its share of the step (by
        # tokens: none, the step's total scales the sums and the gradients at the step)
        self.divisor = 1 if self.tokens is not None else accumulation
        self.scale = 1.0 / self.divisor
        self.this_step = {}  # name -> this step's loss so far (device tensors)
        self.sums = {}       # name -> sum over the applied steps since the last log line
        self.steps = 0       # how many steps `sums` holds: a device count where skips are decided there

    def start_step(self):
        self.this_step = {}
        if self.tokens is not None:
            self.tokens.start_step()

    def parse(self, losses):
        """The loss to train from forward_step's output (a tensor, or a dict of named ones): each entry's
        mean, summed; each (and their sum, `total_loss`) is added to this step's. By tokens: the loss sum."""
        if self.tokens is not None:
            refuse_model_output(losses, instead=f"{FORM} (train.loss_normalization='tokens')")
            loss = self.tokens.take(losses)
            self.this_step["total_loss"] = self.this_step.get("total_loss", 0) + loss.detach().float()
            return loss
        refuse_non_losses(losses)
        named = losses if isinstance(losses, dict) else {}
        if named and "total_loss" in named:
            raise ConfigError("forward_step: a loss named 'total_loss' (the name of their sum): rename it")
        means = {name: value.mean() for name, value in named.items()}
        loss = sum(means.values()) if named else losses.mean()
        for name, value in {**means, "total_loss": loss}.items():
            self.this_step[name] = self.this_step.get(name, 0) + value.detach().float() * self.scale
        return loss

    def normalize_tokens(self, strategy, module):
        """By tokens, at the optimizer step: the factor (ranks / the step's tokens, one collective) applied to
        the gradients of `module` and to this step's logged sums; returned (1 otherwise)."""
        if self.tokens is None:
            return 1
        factor = self.tokens.factor(strategy)
        scale_gradients(module, factor)
        self.this_step = {name: value * factor for name, value in self.this_step.items()}
        return factor

    def end_step(self, result):
        """Add this step's losses to the sums, unless the step (its StepResult) was skipped."""
        if result.found_inf is not None:
            skipped = result.found_inf > 0
            for name, value in self.this_step.items():
                self.sums[name] = self.sums.get(name, 0) + torch.where(skipped, 0.0, value)
            self.steps = self.steps + (1.0 - result.found_inf)  # a device count
        elif not result.nonfinite_names:
            for name, value in self.this_step.items():
                self.sums[name] = self.sums.get(name, 0) + value
            self.steps += 1

    def take_averages(self, reduce_mean, grad_norm):
        """{name: float} averaged over the steps since the last call and over the ranks (`reduce_mean`,
        one collective), with `grad_norm` (a device tensor, or None) as 'grad_norm'; then empty. No loss
        when every step since the last call was skipped."""
        names, steps = sorted(self.sums), self.steps
        on_device = torch.is_tensor(steps)
        values = [self.sums[n] / (steps.clamp(min=1) if on_device else steps) for n in names]
        values += ([steps.float()] if on_device else []) + ([grad_norm.float()] if grad_norm is not None else [])
        values = reduce_mean(torch.stack(values)).tolist() if values else []
        averages = dict(zip(names, values))
        if on_device and values[len(names)] == 0:  # every step since the last log was skipped
            averages = {}
        if grad_norm is not None:
            averages["grad_norm"] = values[-1]
        self.sums, self.steps = {}, 0
        return averages
