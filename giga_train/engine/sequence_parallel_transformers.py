"""Sequence parallelism for transformers models through their attention interface: an attention
implementation named "sequence_parallel" (registered in transformers' AttentionInterface) that calls
`sequence_parallel.attention`. transformers builds no mask for an implementation it has no mask
function for, so the attention is causal (or not) by the module's `is_causal` over the whole sequence.

The caller shards the inputs: `input_ids` (or embeddings) with `shard_sequence`, and passes
`position_ids=sequence_position_ids(n)` so that RoPE sees the global positions of this rank's tokens;
the logits come back with `gather_sequence`. A batch padding mask (`attention_mask`) is not applied:
pad at the end (causal attention never lets a real token see the padding) and mask the labels.
"""
import torch

from . import sequence_parallel as sp

NAME = "sequence_parallel"


def sequence_parallel_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                                        is_causal=None, **kwargs):
    """transformers' attention-function signature: [B, H, S_local, D] in, ([B, S_local, H, D], None) out."""
    if attention_mask is not None:
        raise ValueError(f"attn_implementation={NAME!r}: attention masks are not supported (pad at the end and"
                         " mask the labels)")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    out = sp.attention(query, key, value, dropout_p=dropout if module.training else 0.0, is_causal=is_causal,
                       scale=scaling, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def register():
    """Register the "sequence_parallel" attention implementation with transformers (idempotent)."""
    from transformers import AttentionInterface
    AttentionInterface.register(NAME, sequence_parallel_attention_forward)
    return NAME


def parallelize_transformers(model):
    """Switch a transformers PreTrainedModel to the sequence-parallel attention implementation."""
    model.set_attn_implementation(register())
    return model


def sequence_position_ids(n, device=None):
    """[1, S_local] global positions of this rank's tokens of an n-token sequence (the padding continues
    past n; its outputs are dropped)."""
    world, rank = sp.sequence_world_size(), sp.sequence_rank()
    local = sp.padded_length(n) // world
    return (torch.arange(local, device=device) + rank * local).unsqueeze(0)
