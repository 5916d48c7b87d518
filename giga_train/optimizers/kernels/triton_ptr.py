"""The one Triton helper both fused optimizers share: a typed pointer read from a device address table."""
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
