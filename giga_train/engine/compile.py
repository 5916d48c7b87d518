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

`compile_attention`: False keeps attention out of the compiled graphs: dynamo breaks the graph at
torch.nn.functional.scaled_dot_product_attention (torch._dynamo.disallow_in_graph, for the process), so
SDPA runs as in eager (the same kernel choice and layouts) between compiled pieces; the fused attention
kernel is an external call inside a graph anyway. True keeps it in the graph. Unset: False for diffusers'
models (compiled Wan blocks gave wrong gradients at long sequences; bench/compile_repro.py bisects it),
True otherwise. With attention out, a block that activation checkpointing wraps has its inner forward
compiled and the checkpoint kept outside (dynamo cannot break a graph inside checkpoint's own graph: the
whole block would stay eager).
"""
import logging

import torch

from .activation_checkpointing import checkpointed_inner_forward, replace_inner_forward
from .block_classes import parse_class_names, repeated_block_classes, require_classes
from ..errors import ConfigError
from ..registry import did_you_mean

log = logging.getLogger("giga_train")

TORCH_COMPILE_KEYS = ("backend", "mode", "fullgraph", "dynamic", "options", "disable")
OUR_KEYS = ("use_regional_compilation", "block_class_names", "compile_attention")


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
    if cfg.get("compile_attention") not in (None, True, False):
        return f"compile_attention: expected True or False, got {cfg['compile_attention']!r}"
    if cfg.get("fullgraph") and cfg.get("compile_attention") is False:
        return ("fullgraph=True needs compile_attention=True (attention is kept out of the graph by default,"
                " which breaks it there)")
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
    out_of_graph = not attention_in_graph(model, dynamo_config)
    if out_of_graph:
        keep_attention_out_of_graph()
        log.info("compile: attention kept out of the compiled graphs (train.dynamo_config.compile_attention=True"
                 " puts it in)")
    kwargs = {k: v for k, v in dynamo_config.items() if k in TORCH_COMPILE_KEYS and k != "disable"}
    if isinstance(kwargs.get("backend"), str):
        kwargs["backend"] = kwargs["backend"].lower()  # accelerate spells it INDUCTOR
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
            inner = checkpointed_inner_forward(module) if out_of_graph else None
            if inner is not None:  # a graph break inside checkpoint's graph would leave the block eager
                replace_inner_forward(module, torch.compile(inner, **kwargs))
            else:
                module.compile(**kwargs)
            compiled.append(name)
    log.info("compiled %d blocks of class %s in place (%s)", len(compiled), ", ".join(classes),
             kwargs.get("backend", "inductor"))
    return compiled


def attention_in_graph(model, dynamo_config):
    """compile_attention, or where unset: False for diffusers' models (True under fullgraph), True otherwise."""
    choice = dynamo_config.get("compile_attention")
    if choice is None:
        return bool(dynamo_config.get("fullgraph")) or not type(model).__module__.startswith("diffusers.")
    return choice


def keep_attention_out_of_graph():
    """Dynamo breaks the graph at scaled_dot_product_attention from now on in this process: SDPA runs
    eagerly, its autograd node too (idempotent)."""
    import torch.nn.functional as F
    torch._dynamo.disallow_in_graph(F.scaled_dot_product_attention)


def put_attention_back_in_graph():
    """Undo keep_attention_out_of_graph (tests; a process that compiles another model)."""
    import torch.nn.functional as F
    torch._dynamo.allow_in_graph(F.scaled_dot_product_attention)
