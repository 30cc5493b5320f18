"""Where Triton 3.6's interpreter computes otherwise than a GPU, for the tests that run convnn's
Triton kernels under it (TRITON_INTERPRET=1): the fix the tests apply, so that they check what a GPU
computes.

- float32 -> bfloat16 (`x.to(tl.bfloat16)`, a store of float32 through a bfloat16 pointer): a GPU
  rounds to nearest even (`arith.truncf`, cvt.rn.bf16.f32 on sm_80 and later), as PyTorch does; the
  interpreter's `_convert_float` drops the low 16 bits (round toward zero). The kernels that write
  or round to the op's dtype (select.store_as, attention._rounded, the backward's gradients) would
  then be checked against truncated values. `round_bfloat16_to_nearest_even` replaces that one
  conversion; every other one is the interpreter's.
"""
import numpy as np
import triton.language as tl
from triton._C.libtriton import ir
from triton.runtime import interpreter

_interpreters_conversion = interpreter._convert_float


def float32_to_bfloat16_bits(x):
    """The bfloat16 bit patterns (uint16) of float32 array x rounded to nearest even: the rounding
    bias 0x7FFF plus the lowest kept bit, added below the kept bits (a carry into the exponent rounds
    up to the next binade, the largest finite values to infinity); a NaN stays a quiet NaN of its sign."""
    bits = np.array(x, dtype=np.float32).view(np.uint32).astype(np.uint64)  # a contiguous copy, its shape kept
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    quiet_nan = ((bits >> 16) | 0x0040).astype(np.uint16)
    return np.where(np.isnan(x), quiet_nan, rounded)


def _converted(input, input_dtype, output_dtype, rounding_mode):
    if (input_dtype == tl.float32 and output_dtype == tl.bfloat16
            and rounding_mode in (None, ir.ROUNDING_MODE.RTNE)):
        return float32_to_bfloat16_bits(input)
    return _interpreters_conversion(input, input_dtype, output_dtype, rounding_mode)


def round_bfloat16_to_nearest_even():
    """Makes the interpreter's float32 -> bfloat16 conversion a GPU's (idempotent)."""
    interpreter._convert_float = _converted


def interpreters_own_bfloat16(x):
    """float32 array x converted to bfloat16 bits by the interpreter's own conversion (the tests'
    proof that the fix is still needed)."""
    return _interpreters_conversion(np.array(x, dtype=np.float32), tl.float32, tl.bfloat16, None)


_interpreters_dot = interpreter.InterpreterBuilder.create_dot


def _bfloat16_as_float32(handle):
    """A TensorHandle of bfloat16 bits as the float32 values they hold (exact), else the handle."""
    if handle.dtype.scalar != tl.bfloat16:
        return handle
    values = (handle.data.astype(np.uint32) << 16).view(np.float32)
    return interpreter.TensorHandle(values, tl.float32)


def _dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    return _interpreters_dot(self, _bfloat16_as_float32(a), _bfloat16_as_float32(b), d, input_precision,
                             max_num_imprecise_acc)


def multiply_bfloat16_as_numbers():
    """Makes the interpreter's tl.dot of bfloat16 operands a GPU's (idempotent)."""
    interpreter.InterpreterBuilder.create_dot = _dot
