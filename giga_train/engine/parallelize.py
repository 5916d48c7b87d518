"""parallelize: the model transformations, once, in the order that works: activation checkpointing ->
sequence parallelism (under launch.parallelism_config's sp_size) -> fp8 -> compile -> shard (the strategy's
setup, which also builds the optimizer). Why this order: docs/architecture.md, "parallelize"."""
import logging
from dataclasses import dataclass

from .block_classes import parse_class_names, require_classes
from .compile import block_classes, compile_model, compiles
from ..errors import ConfigError
from .fp8 import EAGER_FP8_NOTE, convert_to_float8, precompute_scales_after_step
from .activation_checkpointing import apply_activation_checkpointing
from .meta_start import MetaStart, on_meta

log = logging.getLogger("giga_train")


@dataclass
class BlockPlan:
    checkpointed: dict  # {class name: None (all) or the first N} for activation checkpointing
    compiled: list      # classes compiled one by one ([] = the whole model); None = no compile


def plan_blocks(model, train, fsdp_config):
    checkpointed = {}
    if train.activation_checkpointing:
        checkpointed = parse_class_names(train.activation_class_names)
        require_classes(model, checkpointed, "train.activation_class_names")
    compiled = None
    if compiles(train.dynamo_config):
        compiled = block_classes(model, train.dynamo_config, train.activation_class_names, fsdp_config) \
            if train.dynamo_config.get("use_regional_compilation", True) else []
    return BlockPlan(checkpointed, compiled)


def sequence_parallel(model):
    """The attention of the models we know (diffusers' Wan, transformers) made sequence-parallel: the model,
    or each member of a ModuleDict. Any other model calls the sequence-parallel attention itself."""
    from torch import nn

    from .sequence_parallel_models import parallelize_for_sequence
    members = list(model.values()) if isinstance(model, nn.ModuleDict) else [model]
    for member in members:
        parallelize_for_sequence(member)


def parallelize(model, strategy, train, fsdp_config, make_optimizer, checkpoint=None, float8=None,
                init_weights=None, from_rank0=False):
    """Transform `model` as the train config says and hand it to `strategy`; returns (model, optimizer).
    `make_optimizer(module)` builds the optimizer over the module the engine steps. `checkpoint(model)` and
    `float8(model)` replace the default activation checkpointing and fp8 conversion (the Trainer's hooks,
    which a project may override). A model on the meta device, or any with `from_rank0` (the key that asked
    for rank-0 loading: rank 0's weights are broadcast), is materialised piece by piece (meta_start.py), by
    `init_weights(model)` when not from rank 0."""
    meta_start = None
    if from_rank0 or on_meta(model):
        if not strategy.starts_from_meta:
            raise ConfigError(f"get_models built {type(model).__name__} on the meta device: only FSDP2"
                              " (distributed_type='FSDP', fsdp_version=2) and DeepSpeed ZeRO-3 materialise it"
                              f" piece by piece; build it on a device under {type(strategy).__name__}")
        meta_start = MetaStart(model, from_rank0, strategy.env.rank, init_weights)
    plan = plan_blocks(model, train, fsdp_config)
    if checkpoint is not None:
        checkpoint(model)
    elif plan.checkpointed:
        apply_activation_checkpointing(model, plan.checkpointed)
    if strategy.mesh is not None and strategy.mesh.dims.sp > 1:
        sequence_parallel(model)
    if float8 is not None:
        float8(model)
    elif train.mixed_precision == "fp8":
        convert_to_float8(model, train.fp8_config, fsdp2=strategy.gathers_float8_weights())
    if train.mixed_precision == "fp8" and plan.compiled is None:
        log.warning(EAGER_FP8_NOTE)
    if plan.compiled is not None:
        compile_model(model, train.dynamo_config, plan.compiled)
    # FSDP shards its wrap classes (block_classes.py)
    model, optimizer = strategy.setup(model, make_optimizer, **({"meta_start": meta_start} if meta_start else {}))
    if train.mixed_precision == "fp8":
        precompute_scales_after_step(strategy.unwrap(), optimizer)
    return model, optimizer
