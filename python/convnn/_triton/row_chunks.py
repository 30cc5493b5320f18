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

The rows need not be consecutive: a [G, rows, width] or [B, H, rows, width] tensor with any strides
but the last (the heads of a [B, N, H*d] projection read in place, issue 38 §1) is addressed by
slice_starts and a row stride, and its chunks are whole where every stride is a multiple of W too
(whole_rows).
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


@triton.jit
def whole_rows(width, batch_stride, head_stride, row_stride, W: tl.constexpr):
    """Whether the rows of a strided tensor (slice_starts) hold whole chunks of W and start on
    multiples of W: its width and every stride multiples of W."""
    return (width % W == 0) & (batch_stride % W == 0) & (head_stride % W == 0) & (row_stride % W == 0)


@triton.jit
def slice_starts(slices, heads, batch_stride, head_stride):
    """The element offsets (int64) of slices g = b * heads + h of a [B, heads, rows, width] tensor
    (a [G, rows, width] one has heads 1 and head_stride 0): b * batch_stride + h * head_stride. The
    C++ launchers' RowLayout (src/ops/cuda/triton/kernel_arguments.h) passes the strides."""
    b = slices // heads
    return b.to(tl.int64) * batch_stride + (slices - b * heads).to(tl.int64) * head_stride


@triton.jit
def row_starts(rows, rows_per_slice, heads, batch_stride, head_stride, row_stride):
    """The element offsets (int64) of the flat rows r = g * rows_per_slice + i of a strided tensor
    (slice_starts): slice g's start plus i * row_stride."""
    slices = rows // rows_per_slice
    return (slice_starts(slices, heads, batch_stride, head_stride)
            + (rows - slices * rows_per_slice).to(tl.int64) * row_stride)
