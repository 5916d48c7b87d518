"""train.attention_backend: the scaled_dot_product_attention kernel of a run, pinned with torch's own
torch.nn.attention.sdpa_kernel around each micro-batch's forward and backward (the backward too, so that
activation checkpointing recomputes attention with the same kernel). None leaves torch's choice."""
import contextlib

ATTENTION_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                      "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}


def attention_backend(name):
    """A context that runs SDPA with the named backend only (None: a no-op)."""
    if name is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(getattr(SDPBackend, ATTENTION_BACKENDS[name]))
