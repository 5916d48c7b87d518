"""train.dynamo_config: torch.compile each repeated block in place (regional compilation).

Every instance of a block class runs the same code, so dynamo traces and inductor compiles one block
and reuses the graph for all of them: compile time is one block's, not the whole model's, and a
change outside the blocks (the loss, the head) cannot recompile the model. Blocks are compiled with
`module.compile()`, in place, so parameter names, state dicts and the sharding wrappers applied
afterwards (fully_shard, DDP) are unchanged.

Which blocks: `block_class_names` if given; else the FSDP wrap classes; else the activation
checkpointing classes; else the classes of the model's repeated blocks (an nn.ModuleList whose
children are all one class). With none found, or `use_regional_compilation=False`, the whole model
is compiled. The names are accelerate's TorchDynamoPlugin fields, so GigaTrain configs carry over.
"""
import logging

from torch import nn

from .config import ConfigError

log = logging.getLogger("giga_train")

TORCH_COMPILE_KEYS = ("backend", "mode", "fullgraph", "dynamic", "options", "disable")
OUR_KEYS = ("use_regional_compilation", "block_class_names")


def check_dynamo_config(cfg):
    """A one-line problem with `train.dynamo_config`, or None (pure: the schema calls it)."""
    from .registry import did_you_mean
    keys = TORCH_COMPILE_KEYS + OUR_KEYS
    for key in cfg:
        if key not in keys:
            return f"unknown key '{key}'{did_you_mean(key, keys)} (keys: {', '.join(keys)})"
    if cfg.get("mode") is not None and cfg.get("options") is not None:
        return "give 'mode' or 'options', not both (torch.compile refuses the pair)"
    names = cfg.get("block_class_names")
    if names is not None and (isinstance(names, str) or not all(isinstance(n, str) for n in names)):
        return f"block_class_names: expected a list of class names, got {names!r}"
    return None


def repeated_block_classes(model):
    """Class names of the children of every ModuleList of 2+ modules that are all one class."""
    names = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 1:
            name = type(module[0]).__name__
            if all(type(child).__name__ == name for child in module) and name not in names:
                names.append(name)
    return names


def _split(names):
    """'A,B' or ['A', 'B__##__4'] -> ['A', 'B'] (the activation-checkpointing count is not ours)."""
    if not names:
        return []
    names = names.split(",") if isinstance(names, str) else names
    return [n.strip().partition("__##__")[0] for n in names if n.strip()]


def block_classes(model, dynamo_config, activation_class_names=(), fsdp_config=None):
    """The class names to compile one by one ([] = compile the whole model)."""
    present = {type(m).__name__ for m in model.modules()}
    explicit = _split(dynamo_config.get("block_class_names"))
    if explicit:
        missing = [n for n in explicit if n not in present]
        if missing:
            raise ConfigError(f"train.dynamo_config.block_class_names: no module of class '{missing[0]}' in the"
                              f" model (classes present: {', '.join(sorted(present))})")
        return explicit
    wrap = _split((fsdp_config or {}).get("fsdp_transformer_layer_cls_to_wrap"))
    for hint in (wrap, _split(activation_class_names)):
        found = [n for n in hint if n in present]
        if found:
            return found
    return repeated_block_classes(model)


def compile_model(model, dynamo_config, activation_class_names=(), fsdp_config=None):
    """Compile `model` in place as `dynamo_config` says. Returns the names of the compiled modules
    ('' for the whole model); [] when dynamo_config is empty or disabled."""
    if not dynamo_config or dynamo_config.get("disable"):
        return []
    problem = check_dynamo_config(dynamo_config)
    if problem:
        raise ConfigError(f"train.dynamo_config: {problem}")
    kwargs = {k: v for k, v in dynamo_config.items() if k in TORCH_COMPILE_KEYS and k != "disable"}
    if isinstance(kwargs.get("backend"), str):
        kwargs["backend"] = kwargs["backend"].lower()  # accelerate spells it INDUCTOR
    classes = []
    if dynamo_config.get("use_regional_compilation", True):
        classes = block_classes(model, dynamo_config, activation_class_names, fsdp_config)
    if not classes:
        model.compile(**kwargs)
        log.info("compiled the whole model (%s)", kwargs.get("backend", "inductor"))
        return [""]
    compiled = []
    for name, module in model.named_modules():
        inside = any(name.startswith(done + ".") for done in compiled)  # one compile per outermost block
        if type(module).__name__ in classes and not inside:
            module.compile(**kwargs)
            compiled.append(name)
    log.info("compiled %d blocks of class %s in place (%s)", len(compiled), ", ".join(classes),
             kwargs.get("backend", "inductor"))
    return compiled
