"""train.dynamo_config: torch.compile each repeated block in place (regional compilation).

One block's graph serves every instance of its class, and parameter names, state dicts and the sharding
wrappers applied afterwards are unchanged; with no block class found, or `use_regional_compilation=False`,
the whole model is compiled. Inductor's mix-order reduction is turned off for what we compile (a user's own
`options` entry wins): docs/performance.md says why."""
import logging


from .block_classes import parse_class_names, repeated_block_classes, require_classes
from ..errors import ConfigError
from ..registry import did_you_mean

log = logging.getLogger("giga_train")

TORCH_COMPILE_KEYS = ("backend", "mode", "fullgraph", "dynamic", "options", "disable")
OUR_KEYS = ("use_regional_compilation", "block_class_names")


def check_dynamo_config(cfg):
    """A one-line problem with `train.dynamo_config`, or None (pure: the schema calls it)."""
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


def block_classes(model, dynamo_config, activation_class_names=(), fsdp_config=None):
    """The class names to compile one by one ([] = compile the whole model)."""
    explicit = parse_class_names(dynamo_config.get("block_class_names"))
    if explicit:
        return require_classes(model, explicit, "train.dynamo_config.block_class_names")
    present = {type(m).__name__ for m in model.modules()}
    wrap = parse_class_names((fsdp_config or {}).get("fsdp_transformer_layer_cls_to_wrap"))
    for hint in (wrap, parse_class_names(activation_class_names)):
        found = [n for n in hint if n in present]
        if found:
            return found
    return repeated_block_classes(model)


MIX_ORDER_REDUCTION = "triton.mix_order_reduction"


def with_inductor_workarounds(kwargs):
    """torch.compile's keyword arguments with mix-order reduction off for the inductor backend: through
    `options` (scoped to what we compile) or, when `mode` is given (torch refuses mode with options),
    in inductor's global config. No change where this torch has no such option."""
    if kwargs.get("backend", "inductor") != "inductor":
        return kwargs
    import torch._inductor.config as inductor_config
    if not hasattr(inductor_config.triton, MIX_ORDER_REDUCTION.split(".")[1]):
        return kwargs
    if kwargs.get("mode") is not None:
        if inductor_config.triton.mix_order_reduction:
            inductor_config.triton.mix_order_reduction = False
            log.info("inductor mix-order reduction turned off for the whole process (dynamo_config.mode is set)")
        return kwargs
    return dict(kwargs, options={MIX_ORDER_REDUCTION: False, **(kwargs.get("options") or {})})


def compiles(dynamo_config):
    return bool(dynamo_config) and not dynamo_config.get("disable")


def compile_model(model, dynamo_config, classes=None):
    """Compile `model` in place as `dynamo_config` says: each module of `classes` (None: block_classes of
    the model; []: the whole model). Returns the names of the compiled modules ('' for the whole model);
    [] when dynamo_config is empty or disabled."""
    if not compiles(dynamo_config):
        return []
    problem = check_dynamo_config(dynamo_config)
    if problem:
        raise ConfigError(f"train.dynamo_config: {problem}")
    kwargs = {k: v for k, v in dynamo_config.items() if k in TORCH_COMPILE_KEYS and k != "disable"}
    if isinstance(kwargs.get("backend"), str):
        kwargs["backend"] = kwargs["backend"].lower()  # accelerate spells it INDUCTOR
    kwargs = with_inductor_workarounds(kwargs)
    if not dynamo_config.get("use_regional_compilation", True):
        classes = []
    elif classes is None:
        classes = block_classes(model, dynamo_config)
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
