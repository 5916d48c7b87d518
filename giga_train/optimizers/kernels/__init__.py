"""Compute for the optimizers: plain torch (every device) and Triton (CUDA), imported lazily so
that CPU machines without triton work."""
import functools
import os


@functools.cache
def triton_available():
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401  (a broken install fails here)
    except Exception:  # ImportError, or a broken install: use the torch path
        return False
    return True


def interpreting():
    """TRITON_INTERPRET=1 runs the kernels on CPU tensors (slow; used by the tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_kernels(backend, tensor):
    """backend 'auto': Triton on CUDA when importable, else torch; 'torch': never; 'triton': always
    (CUDA, or CPU under TRITON_INTERPRET=1), and a one-line error when that cannot be."""
    if backend == "torch":
        return False
    on_device = tensor.is_cuda or (backend == "triton" and interpreting() and tensor.device.type == "cpu")
    ok = on_device and triton_available()  # CPU runs never import triton
    if backend == "triton" and not ok:
        raise RuntimeError("backend='triton' needs triton and a CUDA tensor (or TRITON_INTERPRET=1 on CPU)")
    return ok
