"""Chunks of matrix rows for convnn's Triton kernels (issue 38 §1): a [R, W] block of W consecutive
elements from each of R rows of a row-major [*, width] matrix, such as a row per thread gathered by
index (the values of the selected neighbours, the keys and queries of the backward). The matrix is
float32, bfloat16 or float16 (the pointer's compiled type); a chunk is float32 in registers (half
precision converts exactly) and is stored rounded to the pointer's type, to nearest even.

Triton vectorises a load only where it can prove that a thread's elements are contiguous, on a
16-byte boundary and under one mask. Our kernels take every pointer and size at run time (one
compiled kernel serves every shape: scripts/triton_aot.py), so it can prove none of it, and every
element is a scalar load with its own 64-bit address and mask. A kernel therefore tests once, at
run time, that its matrices start on 16-byte boundaries and that their widths are multiples of W
(whole chunks: PyTorch's allocator and the paper's widths give both), and runs its body with
WHOLE, where these functions load and store 128-bit vectors under the row's mask alone; otherwise
without, element by element as before. The arithmetic is the same either way.
"""
import triton
import triton.language as tl


@triton.jit
def on_16_bytes(ptr):
    """Whether ptr is on a 16-byte boundary."""
    return (ptr.to(tl.int64) & 15) == 0


@triton.jit
def load(ptr, row_starts, first, width, row_ok, WHOLE: tl.constexpr, W: tl.constexpr):
    """[R, W] float32 (whatever ptr's type): columns first .. first + W - 1 of the rows that start at
    element row_starts [R] (int64) of ptr, where row_ok [R] and the column is inside the width; 0
    elsewhere. WHOLE: the caller has tested that ptr is on 16 bytes and the width a multiple of W
    (whole), and passes row starts that are multiples of the width and a first column that is a
    multiple of W."""
    columns = first + tl.arange(0, W)
    at = ptr + row_starts[:, None] + columns[None, :]
    if WHOLE:
        chunk = tl.load(tl.multiple_of(at, [16, 16]), mask=row_ok[:, None], other=0.0)
    else:
        chunk = tl.load(at, mask=row_ok[:, None] & (columns < width)[None, :], other=0.0)
    return chunk.to(tl.float32)


@triton.jit
def store(ptr, row_starts, first, width, row_ok, chunk, WHOLE: tl.constexpr, W: tl.constexpr):
    """Stores chunk [R, W] (float32) where load would read it, in ptr's type."""
    columns = first + tl.arange(0, W)
    at = ptr + row_starts[:, None] + columns[None, :]
    chunk = chunk.to(ptr.dtype.element_ty)
    if WHOLE:
        tl.store(tl.multiple_of(at, [16, 16]), chunk, mask=row_ok[:, None])
    else:
        tl.store(at, chunk, mask=row_ok[:, None] & (columns < width)[None, :])


@triton.jit
def whole(width, W: tl.constexpr):
    """Whether rows of this width hold whole chunks of W."""
    return width % W == 0
