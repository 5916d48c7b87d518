"""mixed_precision="fp8": nn.Linear layers trained in float8 through torchao (`pip install giga-train[fp8]`),
everything else under bf16 autocast.

Which Linears stay in high precision (the output head, `train.fp8_config.exclude`, dimensions that are no
multiple of 16), the conversion, and under FSDP2 with tensorwise scaling the float8 all-gather and the scales
computed after each optimizer step (docs/guide.md, "Compilation and fp8")."""
import logging

from torch import nn

from ..errors import ConfigError
from ..registry import did_you_mean

log = logging.getLogger("giga_train")

RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
FP8_KEYS = ("recipe", "exclude", "fsdp_float8_all_gather", "pad_inner_dim")


def check_fp8_config(cfg):
    """A one-line problem with `train.fp8_config`, or None (pure: the schema calls it)."""
    for key in cfg:
        if key not in FP8_KEYS:
            return f"unknown key '{key}'{did_you_mean(key, FP8_KEYS)} (keys: {', '.join(FP8_KEYS)})"
    recipe = cfg.get("recipe", "tensorwise")
    if recipe not in RECIPES:
        return f"recipe: {recipe!r} is not one of {', '.join(RECIPES)}{did_you_mean(recipe, RECIPES)}"
    exclude = cfg.get("exclude")
    if exclude is not None and (isinstance(exclude, str) or not all(isinstance(n, str) for n in exclude)):
        return f"exclude: expected a list of module names, got {exclude!r}"
    if cfg.get("pad_inner_dim") not in (None, True, False):
        return f"pad_inner_dim: expected True or False, got {cfg['pad_inner_dim']!r}"
    if cfg.get("fsdp_float8_all_gather") and recipe != "tensorwise":
        return "fsdp_float8_all_gather: torchao all-gathers float8 weights only with recipe='tensorwise'"
    return None


def head_names(model):
    """The output head's module names. Among the Linears outside the repeated blocks (the children of
    any nn.ModuleList): those whose out_features is an Embedding's vocabulary, else the last one."""
    stacks = [name for name, m in model.named_modules() if isinstance(m, nn.ModuleList)]
    linears = [name for name, m in model.named_modules()
               if type(m) is nn.Linear and not any(name.startswith(s + ".") for s in stacks if s)]
    modules = dict(model.named_modules())
    vocabs = {m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)}
    heads = [name for name in linears if modules[name].out_features in vocabs]
    return heads or linears[-1:]


def _excluded(name, exclude):
    return any(e and e in name for e in exclude)  # substring match, as torchao's filter_fqns


def float8_linear_names(model, exclude=None):
    """Names of the Linears to train in float8 (pure: no torchao needed). `exclude`: module names
    (substring match) kept in high precision; None = the output head."""
    exclude = head_names(model) if exclude is None else list(exclude)
    return [name for name, m in model.named_modules()
            if type(m) is nn.Linear and m.in_features % 16 == 0 and m.out_features % 16 == 0
            and not _excluded(name, exclude)]


def _torchao_float8():
    try:
        import torchao.float8 as float8
    except ImportError as e:
        raise ConfigError(f"train.mixed_precision: 'fp8' needs the torchao package (pip install torchao, or"
                          f" giga-train[fp8]); importing it failed: {e}") from None
    return float8


def convert_to_float8(model, fp8_config=None, fsdp2=False):
    """Swap the chosen Linears for torchao Float8Linear in place; returns their names.

    `fsdp2`: the strategy will fully_shard the model, so float8 all-gather is switched on (tensorwise)
    unless fp8_config.fsdp_float8_all_gather says otherwise."""
    cfg = dict(fp8_config or {})
    problem = check_fp8_config(cfg)
    if problem:
        raise ConfigError(f"train.fp8_config: {problem}")
    float8 = _torchao_float8()
    recipe = cfg.get("recipe", "tensorwise")
    config = float8.Float8LinearConfig.from_recipe_name(recipe)
    all_gather = cfg.get("fsdp_float8_all_gather")
    if all_gather is None:
        all_gather = fsdp2 and recipe == "tensorwise"
    if all_gather:
        config = float8.Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    config = float8_config_padded(config, cfg.get("pad_inner_dim", True))
    names = set(float8_linear_names(model, cfg.get("exclude")))
    if not names:
        log.warning("mixed_precision='fp8': no Linear qualifies for float8 (dims multiple of 16, not"
                    " excluded); the model trains in bf16")
        return []
    float8.convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn in names, config=config)
    log.info("fp8: %d Linear layers in float8 (%s%s); kept in high precision: %s", len(names), recipe,
             ", float8 all-gather" if all_gather else "",
             ", ".join(n for n, m in model.named_modules() if type(m) is nn.Linear) or "none")
    return sorted(names)


def float8_config_padded(config, pad_inner_dim=True):
    """torchao's Float8LinearConfig with pad_inner_dim set: a GEMM whose contracted dimension (the tokens in
    the weight gradient) is not a multiple of 16 is padded instead of refused by torch._scaled_mm."""
    import dataclasses
    return dataclasses.replace(config, pad_inner_dim=bool(pad_inner_dim))


EAGER_FP8_NOTE = ("mixed_precision='fp8' without train.dynamo_config runs float8 eagerly, slower than bf16 (the"
                  " casts are separate kernels): set train.dynamo_config=dict(backend='inductor') to compile the"
                  " blocks (their casts fuse), or use 'bf16'")


def precompute_scales_after_step(model, optimizer):
    """Under FSDP2 float8 all-gather: compute every float8 weight's scale in one all-reduce after each
    optimizer step (torchao's recommended extra). A no-op hook is not registered when there is none."""
    try:
        from torch.distributed.tensor import DTensor
        from torchao.float8.float8_linear import Float8Linear
        from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor, \
            precompute_float8_dynamic_scale_for_fsdp
    except ImportError:
        return None
    sharded = any(isinstance(m, Float8Linear) and isinstance(m.weight, DTensor)
                  and isinstance(m.weight._local_tensor, WeightWithDynamicFloat8CastTensor) for m in model.modules())
    if not sharded:
        return None
    return optimizer.register_step_post_hook(lambda *_: precompute_float8_dynamic_scale_for_fsdp(model))


def plain_tensors(state):
    """`state` with torchao's float8 all-gather weight wrappers replaced by the plain tensors they hold:
    what a checkpoint stores (safetensors cannot write a tensor subclass, nor DCP read one back with
    weights_only). A shard (DTensor) keeps its placement around the plain tensor, sharing its storage."""
    import sys
    fsdp_utils = sys.modules.get("torchao.float8.fsdp_utils")  # never loaded: nothing can be wrapped
    if fsdp_utils is None:
        return state
    from torch.distributed.tensor import DTensor
    wrapper = fsdp_utils.WeightWithDynamicFloat8CastTensor

    def plain(value):
        if isinstance(value, wrapper):
            return value._tensor
        if isinstance(value, DTensor) and isinstance(value._local_tensor, wrapper):
            return DTensor(value._local_tensor._tensor, value._spec, requires_grad=False)
        return value
    return {k: plain(v) for k, v in state.items()}
