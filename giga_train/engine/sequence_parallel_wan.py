"""Sequence parallelism for diffusers' Wan transformer (WanTransformer3DModel) through our attention:
forward hooks at the places of diffusers' own `_cp_plan` for Wan (the rotary embeddings and the first
block's hidden states are sharded along the token sequence, a per-token timestep too, `proj_out`'s output
is gathered) and a self-attention processor that calls `sequence_parallel.attention`. Cross-attention
needs nothing: its queries are this rank's tokens and its keys the whole text on every rank.

Every hook is the identity while no SP group is set, so one model object runs with and without SP.
The sequence is padded to a multiple of the SP size and the padded tokens are masked as keys; the
padding is dropped at the gather, so any latent size gives the one-process result.
"""
import torch

from . import sequence_parallel as sp


def _rotate(x, cos, sin):
    """Wan's rotary embedding on [B, S, H, D] (pairs of adjacent channels), as diffusers applies it."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2).type_as(x)


class WanSequenceParallelAttnProcessor:
    """Wan self-attention over the sharded sequence (`attention` of sequence_parallel); the wrapped
    processor runs cross-attention and everything while no SP group is set."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        if encoder_hidden_states is not None or sp.sequence_group() is None:
            return self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
        from diffusers.models.transformers.transformer_wan import _get_qkv_projections
        query, key, value = _get_qkv_projections(attn, hidden_states, None)
        query, key = attn.norm_q(query), attn.norm_k(key)
        query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (query, key, value))
        if rotary_emb is not None:
            query, key = _rotate(query, *rotary_emb), _rotate(key, *rotary_emb)
        out = sp.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                           attn_mask=attention_mask)
        out = out.transpose(1, 2).flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))


def _shard_rope(module, args, output):
    if sp.sequence_group() is None:
        return output
    return tuple(sp.shard_sequence(t, 1) for t in output)  # (cos, sin), each [1, S, 1, D]


def _shard_first_block_input(module, args, kwargs):
    if sp.sequence_group() is None:
        return None
    if args:
        return (sp.shard_sequence(args[0], 1),) + tuple(args[1:]), kwargs
    return args, dict(kwargs, hidden_states=sp.shard_sequence(kwargs["hidden_states"], 1))


def _shard_token_timestep(module, args, kwargs):
    """Wan 2.2 TI2V passes a timestep per token ([B, S]): each rank keeps its tokens' timesteps."""
    if sp.sequence_group() is None:
        return None
    timestep = kwargs.get("timestep", args[1] if len(args) > 1 else None)
    if timestep is None or timestep.ndim != 2:
        return None
    timestep = sp.shard_sequence(timestep, 1)
    if "timestep" in kwargs:
        return args, dict(kwargs, timestep=timestep)
    return (args[0], timestep) + tuple(args[2:]), kwargs


def _gather_output(module, args, output):
    if sp.sequence_group() is None:
        return output
    return sp.gather_sequence(output, 1)


def parallelize_wan(model):
    """Install the hooks and processors on a WanTransformer3DModel (once; idempotent)."""
    if getattr(model, "_giga_sequence_parallel", False):
        return model
    for block in model.blocks:
        block.attn1.set_processor(WanSequenceParallelAttnProcessor(block.attn1.processor))
    model.rope.register_forward_hook(_shard_rope)
    model.blocks[0].register_forward_pre_hook(_shard_first_block_input, with_kwargs=True)
    model.register_forward_pre_hook(_shard_token_timestep, with_kwargs=True)
    model.proj_out.register_forward_hook(_gather_output)
    model._giga_sequence_parallel = True
    return model
