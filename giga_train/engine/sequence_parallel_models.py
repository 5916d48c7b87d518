"""Make a model's attention sequence-parallel where we know how: diffusers' Wan transformer (hooks and an
attention processor), transformers models (the "sequence_parallel" attention implementation). Other
models are returned unchanged: their own attention calls `sequence_parallel.attention`."""
from .sequence_parallel_transformers import parallelize_transformers
from .sequence_parallel_wan import parallelize_wan


def parallelize_for_sequence(model):
    """The model, its attention made sequence-parallel (identity while no SP group is set)."""
    if type(model).__name__ == "WanTransformer3DModel":
        return parallelize_wan(model)
    if hasattr(model, "set_attn_implementation") and hasattr(model, "config"):
        return parallelize_transformers(model)
    return model
