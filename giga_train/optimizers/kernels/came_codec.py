"""Triton helpers of the fused CAME step: the 8-bit codec, the rounding noise and the typed
parameter store. Each evaluates the same fp32/integer formulas as its torch twin (qmap.py,
rounding.py), so kernels and the torch path compute the same function."""
import triton
import triton.language as tl

from . import qmap, rounding

_ZERO = tl.constexpr(qmap.ZERO_CODE)
_LEVELS = tl.constexpr(float(qmap.LEVELS))
_INV_SQ = tl.constexpr(qmap.INV_SQ)
_MIX = tl.constexpr(rounding.MIX)
_SPREAD = tl.constexpr(rounding.SPREAD)
_MUL = tl.constexpr(rounding.MUL)


@triton.jit
def decode(code):
    """int32 codes -> values for absmax 1: sign * (k / 127)^2, k*|k| exact in fp32."""
    k = code - _ZERO
    return (k * tl.abs(k)).to(tl.float32) * _INV_SQ


@triton.jit
def encode(x):
    """x / absmax in [-1, 1] -> int32 code 127 + sign * floor(127 sqrt|x| + 0.5): no search."""
    k = tl.minimum(tl.floor(tl.sqrt(tl.abs(x)) * _LEVELS + 0.5), _LEVELS).to(tl.int32)
    return tl.where(x < 0, _ZERO - k, _ZERO + k)


@triton.jit
def seed_key(STEP, k, group_index, param_index):
    """rounding.seed_key from tensor k's fp32 step count (before this step's increment)."""
    step = tl.load(STEP + k).to(tl.int64)
    key = (step * _MIX + group_index) & 0x7FFFFFFF
    return (key * _MIX + param_index) & 0x7FFFFFFF


@triton.jit
def noise16(idx, key):
    """rounding.noise16: the uint32 hash of element index idx under key, low 16 bits."""
    x = idx.to(tl.uint32) * _SPREAD + key.to(tl.uint32)
    x = ((x >> 16) ^ x) * _MUL
    x = ((x >> 16) ^ x) * _MUL
    x = (x >> 16) ^ x
    return (x & 0xFFFF).to(tl.int32)


@triton.jit
def store_param(ptr, offs, mask, value, key, KIND: tl.constexpr):
    """fp32 value -> bf16 (KIND 1, stochastic rounding keyed on the element index), fp16 (2) or
    fp32 (else)."""
    if KIND == 1:
        bits = (value.to(tl.int32, bitcast=True) + noise16(offs, key)) & -65536
        value = bits.to(tl.float32, bitcast=True)
    tl.store(ptr + offs, value.to(ptr.dtype.element_ty), mask=mask)
