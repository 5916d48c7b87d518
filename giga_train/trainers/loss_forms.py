"""What forward_step (or validation_step) may return as losses, and one line for what it may not: a model's
output object (transformers' ModelOutput, diffusers' BaseOutput: their logits, cache or sample would be
averaged into the loss), a dict value that is not a tensor, a model output's field beside the losses. Type
checks only: nothing is read from the device."""
import torch

from ..errors import ConfigError

# The fields of transformers' model outputs that are never a loss
NOT_LOSSES = ("logits", "hidden_states", "attentions", "past_key_values", "cache", "last_hidden_state")


def _output_object(losses):
    return type(losses) is not dict and type(losses).__module__.split(".", 1)[0] in ("transformers", "diffusers")


def refuse_model_output(losses, where="forward_step", instead=None):
    """A transformers/diffusers output object, refused naming its fields and what to return `instead`."""
    if _output_object(losses):
        fields = ", ".join(losses)
        if instead is None:
            instead = ("its .loss" if losses.get("loss") is not None else
                       "a loss (it holds none: pass labels= to the model, or compute one)") + \
                ", or a dict of named losses only"
        raise ConfigError(f"{where}: returned the model's {type(losses).__name__} ({fields}): return {instead}")


def refuse_non_losses(losses, where="forward_step"):
    """forward_step's output in the default mode: a tensor, or a dict whose every value is a loss tensor."""
    if torch.is_tensor(losses):
        return
    refuse_model_output(losses, where)
    if not isinstance(losses, dict):
        raise ConfigError(f"{where}: return a loss tensor or a dict of named loss tensors; got {type(losses).__name__}")
    for name, value in losses.items():
        if not torch.is_tensor(value):
            raise ConfigError(f"{where}: {name!r} is not a loss tensor ({type(value).__name__}): return the losses only")
        if name in NOT_LOSSES:
            raise ConfigError(f"{where}: {name!r} is a model output, not a loss (each value returned is averaged into"
                              f" the loss): return the losses only, e.g. out.loss")
