"""The benches' model: examples/llama/model.py's Llama-style decoder and its named shapes (tiny, 1b, 8b, 8b8, 13b)."""
from examples.llama.model import (SHAPES, Attention, Block, FeedForward, Llama, RMSNorm, Shape,  # noqa: F401
                                  SyntheticTokens, apply_rope, rope_tables, shape_of)
