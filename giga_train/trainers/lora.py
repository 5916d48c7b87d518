"""train.lora applied: peft's get_peft_model around the model get_models returned (or the ModuleDict members
train.lora.model names), before the engine wraps it; peft freezes the base. Its checkpoints then hold the
adapter only (checkpoint/formats/adapters.py)."""
import logging

from ..errors import ConfigError
from ..module_dict import ModuleDict
from ..registry import did_you_mean
from ..schema.lora import lora_config

log = logging.getLogger("giga_train")


def with_lora(model, lora):
    """`model` (get_models' one module) with train.lora's adapter added (`lora`: the filled section, or None:
    `model` as it is)."""
    if not lora:
        return model
    if isinstance(model, ModuleDict):
        for name in members_to_adapt(model, lora.model):
            model[name] = _adapted(model[name], lora, f"models member '{name}'")
        return model
    if lora.model is not None:
        raise ConfigError(f"train.lora.model: {lora.model!r} names a ModuleDict member, but get_models returned one"
                          f" {type(model).__name__}; leave model=None to adapt it")
    return _adapted(model, lora, "the model")


def members_to_adapt(model, names):
    """The ModuleDict members train.lora.model names (None: the only member)."""
    members = list(model.keys())
    if names is None:
        if len(members) != 1:
            raise ConfigError(f"train.lora.model: get_models returned a ModuleDict of {len(members)} members"
                              f" ({', '.join(members)}): name the one(s) to adapt")
        return members
    names = [names] if isinstance(names, str) else list(names)
    for name in names:
        if name not in model:
            raise ConfigError(f"train.lora.model: {name!r} is not a member of get_models' ModuleDict"
                              f"{did_you_mean(name, members)} (members: {', '.join(members)})")
    return names


def _adapted(module, lora, where):
    import peft
    if isinstance(module, peft.PeftModel):
        raise ConfigError(f"train.lora: {where} is already a peft.PeftModel (get_models wrapped it); drop"
                          " train.lora or the get_peft_model call")
    config = lora_config(lora)
    try:
        adapted = peft.get_peft_model(module, config)
    except (ValueError, TypeError, NotImplementedError) as e:  # e.g. "Target modules {...} not found in the base model"
        line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        key = "train.lora.target_modules" if "target modules" in line.lower() else "train.lora"
        raise ConfigError(f"{key}: peft's get_peft_model refuses it for {where}: {line}") from None
    if lora.base is not None:
        adapted.peft_config[adapted.active_adapter].base_model_name_or_path = lora.base
    trainable = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    total = sum(p.numel() for p in adapted.parameters())
    targets = adapted.peft_config[adapted.active_adapter].target_modules
    log.info("train.lora: %s adapted (rank %d on %s): %d of %d parameters trained (%.2f%%)", where, lora.rank,
             targets if isinstance(targets, str) else sorted(targets or ()), trainable, total,
             100 * trainable / max(total, 1))
    return adapted
