"""PEFT adapters in checkpoints: a peft.PeftModel member whose trainable parameters are all its adapter's is
saved as the adapter alone, in PEFT's format (its EMA too), meta.json naming the base and mapping the keys;
resume loads it into the model get_models rebuilt. The base is never gathered nor written (docs/guide.md,
"LoRA")."""
import sys

import torch

from ...errors import ConfigError

ADAPTER_WEIGHTS, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"
WRAPPED = "_checkpoint_wrapped_module."  # activation checkpointing's wrapper in a parameter's name


def adapter_keys(module):
    """{PEFT's key in adapter_model.safetensors: the module's own key} when `module` is a PeftModel whose
    trainable parameters are all in its adapter state; None otherwise (then it is saved whole)."""
    peft = sys.modules.get("peft")  # imported by the project's get_models when it made one
    if peft is None or not isinstance(module, peft.PeftModel):
        return None
    # the state dict's names (activation checkpointing's wrapper is in named_parameters' only)
    names = [name.replace(WRAPPED, "") for name, p in module.named_parameters() if p.requires_grad]
    tagged = {name: torch.tensor(i) for i, name in enumerate(names)}  # PEFT renames and filters the keys
    # save_embedding_layers: the frozen embeddings peft may add are not trainable, so never among `tagged` (its
    # 'auto' looks for the base's config.json at every call and warns when that is not a transformers folder)
    adapter = peft.get_peft_model_state_dict(module, state_dict=tagged, save_embedding_layers=False)
    if not names or len(adapter) != len(names):
        return None  # a trainable base weight too (or nothing trainable): the whole model
    return {key: names[int(index)] for key, index in adapter.items()}


def adapter_layout(members):
    """meta.json's `adapters`: {folder: {base, keys}} for each (folder, module) that saves as an adapter."""
    found = {}
    for folder, module in members:
        keys = adapter_keys(module)
        if keys is not None:
            config = module.peft_config[module.active_adapter]
            base = type(module.get_base_model())
            found[folder] = dict(base=config.base_model_name_or_path, base_class=f"{base.__module__}.{base.__qualname__}",
                                 keys=keys)
    return found


def saved_keys(members):
    """The model's state-dict keys a checkpoint holds when a member saves as an adapter (`members`: model_folders'
    (folder, prefix, module)): each adapter member's trainable parameters, every key of the others; None when
    no member is an adapter (everything is saved)."""
    keys, adapted = [], False
    for _, prefix, member in members:
        names = adapter_keys(member)
        adapted = adapted or names is not None
        keys += [prefix + k for k in (member.state_dict() if names is None else names.values())]
    return set(keys) if adapted else None


def all_adapters(members):
    """Whether every one of `members` (model_folders') saves as an adapter."""
    return all(adapter_keys(member) is not None for _, _, member in members)


def only(state, keys):
    """`state` restricted to `keys` (None: all of it)."""
    return state if keys is None else {k: v for k, v in state.items() if k in keys}


def write_adapter(folder, module, part, write_tensors):
    """The adapter of `module` into `folder`: its config and weights (from `part`, the module's state)."""
    keys = adapter_keys(module)
    config = module.peft_config[module.active_adapter]
    mode, config.inference_mode = config.inference_mode, True  # as PeftModel.save_pretrained writes it
    try:
        config.save_pretrained(folder)
    finally:
        config.inference_mode = mode
    write_tensors(f"{folder}/{ADAPTER_WEIGHTS}", {key: part[name] for key, name in keys.items()}, True)


def model_keys(part, keys, prefix):
    """An adapter file's tensors `part` under the model's keys (`keys`: meta.json's map), with `prefix`."""
    return {prefix + keys[key]: value for key, value in part.items() if key in keys}


def check_adapter_fit(module, state, checkpoint):
    """One line unless `state` (an adapter checkpoint's weights) holds every trainable parameter of `module`
    and only keys of it (the frozen base is what get_models built)."""
    trainable = [n.replace(WRAPPED, "") for n, p in module.named_parameters() if p.requires_grad]
    missing = sorted(n for n in trainable if n not in state)
    unexpected = sorted(set(state) - set(module.state_dict()))
    if missing or unexpected:
        wrong = missing or unexpected
        raise ConfigError(f"{checkpoint}: its adapter weights do not fit the model ({len(wrong)}"
                          f" {'trainable parameters missing' if missing else 'unexpected keys'}, e.g. '{wrong[0]}'):"
                          " give get_models the same PEFT config")
