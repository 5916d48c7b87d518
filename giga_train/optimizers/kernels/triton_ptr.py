"""Triton helpers of multi-tensor kernels: a tensor's pointer from a device table."""
import triton
import triton.language as tl


@triton.jit
def table_ptr(tab, k, KIND: tl.constexpr, ALIGNED: tl.constexpr):
    """Entry k of the int64 address table `tab` as a bf16 (KIND 1), fp16 (2) or fp32 (else) pointer."""
    addr = tl.load(tab + k)
    if ALIGNED:  # lets the compiler vectorise loads through the table's addresses
        addr = tl.multiple_of(addr, 16)
    if KIND == 1:
        ptr = addr.to(tl.pointer_type(tl.bfloat16))
    elif KIND == 2:
        ptr = addr.to(tl.pointer_type(tl.float16))
    else:
        ptr = addr.to(tl.pointer_type(tl.float32))
    return ptr


@triton.jit
def offset_ptr(BASE, OFF, k, ALIGNED: tl.constexpr):
    """BASE (the bucket's first tensor) + entry k of the int64 element-offset table `OFF`. Unlike an
    address cast from an integer, arithmetic on a pointer argument keeps Triton's alignment
    analysis, so loads through it vectorise (16 bytes a thread) and 2-D tiles get row layouts."""
    off = tl.load(OFF + k)
    if ALIGNED:
        off = tl.multiple_of(off, 16)
    return BASE + off
