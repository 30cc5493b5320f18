"""Fused GPU kernels of knn_aggregate, in Triton (issue 25, first kernels): depthwise,

    output[g, i, c] = sum_k weights[g, i, k] * values[g, indices[g, i, k], c] * kernel[c, k] + bias[c],

and standard (kernel [C', C, K], the matrix products by tl.dot in IEEE float32: the neighbours are
weighted exactly as on the CPU, not in TF32), and their backward. Written so that what Triton's CPU interpreter (TRITON_INTERPRET=1, which the
tests use on this project's GPU-less machines) cannot check cannot happen on a GPU:
- every output element is written by exactly one program instance, no atomics, no communication
  between programs: the gradients of the values go through an inverse index (the slots sorted
  stably by the row they read, as the generic path's), each row's terms added in slot order, so
  two backward passes are bitwise equal;
- every load and store is masked to its tensor's extent (the interpreter does not catch an
  out-of-bounds access; the tests run the kernels on outputs with guard regions);
- loops over runtime bounds are `while` loops: with numpy 2.4 the interpreter fails on a `range`
  with a runtime bound (triton-lang/triton#9171, fixed after Triton 3.6.0).
Accumulation is float32 for float32, bfloat16 and float16 inputs, float64 for float64.

The C++ launchers (src/ops/cuda/triton/aggregate_launches.cpp) pass contiguous tensors that the
op's own checks have accepted.
"""
import triton
import triton.language as tl

ROWS = 32       # query rows (of the flattened G*N) per program
CHANNELS = 32   # channels per program
# The kernel's gradient sums over all G*N rows: split into about this many chunks of rows, so that
# (channel blocks x slots x chunks) programs fill a GPU (measured on an H100: one program per channel
# block and slot, 16 at the paper's configuration, took 5.3 ms where the forward takes 0.04 ms).
KERNEL_GRADIENT_CHUNKS = 128


@triton.jit
def _forward_kernel(values_ptr, weights_ptr, indices_ptr, kernel_ptr, bias_ptr, output_ptr,
                    rows_total, n, m, c, k, HAS_BIAS: tl.constexpr,
                    ROWS: tl.constexpr, CHANNELS: tl.constexpr, ACC: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    channels = tl.program_id(1) * CHANNELS + tl.arange(0, CHANNELS)
    row_ok = rows < rows_total
    channel_ok = channels < c
    both_ok = row_ok[:, None] & channel_ok[None, :]
    slice_start = (rows // n).to(tl.int64) * m  # first values row of each query row's slice
    acc = tl.zeros([ROWS, CHANNELS], dtype=ACC)
    slot = 0
    while slot < k:
        index = tl.load(indices_ptr + rows.to(tl.int64) * k + slot, mask=row_ok, other=0)
        weight = tl.load(weights_ptr + rows.to(tl.int64) * k + slot, mask=row_ok, other=0.0).to(ACC)
        neighbour = tl.load(values_ptr + (slice_start + index)[:, None] * c + channels[None, :],
                            mask=both_ok, other=0.0).to(ACC)
        tap = tl.load(kernel_ptr + channels * k + slot, mask=channel_ok, other=0.0).to(ACC)
        acc += weight[:, None] * neighbour * tap[None, :]
        slot += 1
    if HAS_BIAS:
        acc += tl.load(bias_ptr + channels, mask=channel_ok, other=0.0).to(ACC)[None, :]
    tl.store(output_ptr + rows.to(tl.int64)[:, None] * c + channels[None, :],
             acc.to(output_ptr.dtype.element_ty), mask=both_ok)


@triton.jit
def _weights_gradient_kernel(grad_output_ptr, values_ptr, indices_ptr, kernel_ptr, grad_weights_ptr,
                             rows_total, n, m, c, k, ROWS: tl.constexpr, CHANNELS: tl.constexpr, ACC: tl.constexpr):
    """grad_weights[row, slot] = sum_c dy[row, c] * kernel[c, slot] * values[slice, index, c]: one
    program per block of rows and one slot; the channels in blocks, in order."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    slot = tl.program_id(1)
    row_ok = rows < rows_total
    slice_start = (rows // n).to(tl.int64) * m
    index = tl.load(indices_ptr + rows.to(tl.int64) * k + slot, mask=row_ok, other=0)
    acc = tl.zeros([ROWS], dtype=ACC)
    first = 0
    while first < c:
        channels = first + tl.arange(0, CHANNELS)
        channel_ok = channels < c
        both_ok = row_ok[:, None] & channel_ok[None, :]
        dy = tl.load(grad_output_ptr + rows.to(tl.int64)[:, None] * c + channels[None, :],
                     mask=both_ok, other=0.0).to(ACC)
        neighbour = tl.load(values_ptr + (slice_start + index)[:, None] * c + channels[None, :],
                            mask=both_ok, other=0.0).to(ACC)
        tap = tl.load(kernel_ptr + channels * k + slot, mask=channel_ok, other=0.0).to(ACC)
        acc += tl.sum(dy * neighbour * tap[None, :], axis=1)
        first += CHANNELS
    tl.store(grad_weights_ptr + rows.to(tl.int64) * k + slot, acc.to(grad_weights_ptr.dtype.element_ty),
             mask=row_ok)


@triton.jit
def _kernel_gradient_kernel(grad_output_ptr, values_ptr, weights_ptr, indices_ptr, partial_ptr,
                            rows_total, n, m, c, k, rows_per_chunk,
                            ROWS: tl.constexpr, CHANNELS: tl.constexpr, ACC: tl.constexpr):
    """partial[chunk, c, slot] = sum over the chunk's rows of w * values[slice, index, c] * dy[row, c]:
    one program per block of channels, slot and chunk of rows, walking its row blocks in order (no
    atomics); kernel_gradient() then sums the chunks in a fixed order."""
    channels = tl.program_id(0) * CHANNELS + tl.arange(0, CHANNELS)
    slot = tl.program_id(1)
    chunk = tl.program_id(2)
    channel_ok = channels < c
    acc = tl.zeros([CHANNELS], dtype=ACC)
    first = chunk * rows_per_chunk
    end = tl.minimum(first + rows_per_chunk, rows_total)
    while first < end:
        rows = first + tl.arange(0, ROWS)
        row_ok = rows < end
        both_ok = row_ok[:, None] & channel_ok[None, :]
        slice_start = (rows // n).to(tl.int64) * m
        index = tl.load(indices_ptr + rows.to(tl.int64) * k + slot, mask=row_ok, other=0)
        weight = tl.load(weights_ptr + rows.to(tl.int64) * k + slot, mask=row_ok, other=0.0).to(ACC)
        neighbour = tl.load(values_ptr + (slice_start + index)[:, None] * c + channels[None, :],
                            mask=both_ok, other=0.0).to(ACC)
        dy = tl.load(grad_output_ptr + rows.to(tl.int64)[:, None] * c + channels[None, :],
                     mask=both_ok, other=0.0).to(ACC)
        acc += tl.sum(weight[:, None] * neighbour * dy, axis=0)
        first += ROWS
    tl.store(partial_ptr + (chunk.to(tl.int64) * c + channels) * k + slot, acc, mask=channel_ok)


@triton.jit
def _values_gradient_kernel(grad_output_ptr, weights_ptr, kernel_ptr, order_ptr, run_start_ptr,
                            grad_values_ptr, c, k, CHANNELS: tl.constexpr, ACC: tl.constexpr):
    """grad_values[slice, row, c] = sum over the slots that read this row, in slot order, of
    w[slot] * kernel[c, slot % k] * dy[slot // k, c]: one program per values row and block of
    channels, its slots the run [run_start[row], run_start[row + 1]) of the inverse index."""
    value_row = tl.program_id(0)
    channels = tl.program_id(1) * CHANNELS + tl.arange(0, CHANNELS)
    channel_ok = channels < c
    position = tl.load(run_start_ptr + value_row)
    end = tl.load(run_start_ptr + value_row + 1)
    acc = tl.zeros([CHANNELS], dtype=ACC)
    while position < end:
        # A flattened [G*N*K] slot, within 32 bits (aggregate_fits): int64 division is a long subroutine.
        slot_index = tl.load(order_ptr + position).to(tl.int32)
        query_row = slot_index // k
        weight = tl.load(weights_ptr + slot_index).to(ACC)
        tap = tl.load(kernel_ptr + channels * k + (slot_index - query_row * k), mask=channel_ok, other=0.0).to(ACC)
        dy = tl.load(grad_output_ptr + query_row.to(tl.int64) * c + channels, mask=channel_ok, other=0.0).to(ACC)
        acc += weight * tap * dy
        position += 1
    tl.store(grad_values_ptr + value_row.to(tl.int64) * c + channels, acc.to(grad_values_ptr.dtype.element_ty),
             mask=channel_ok)


@triton.jit
def _standard_forward_kernel(values_ptr, weights_ptr, indices_ptr, kernel_ptr, bias_ptr, output_ptr,
                             rows_total, n, m, c, c_out, k, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr,
                             CHANNELS: tl.constexpr, ACC: tl.constexpr):
    """output[row, o] = sum_k sum_c w[row, k] * values[slice, index, c] * kernel[o, c, k] (+ bias[o]):
    one program per block of rows and block of output channels; the input channels in blocks, each
    a matrix product of the weighted neighbourhoods [ROWS, CHANNELS] with the slot's kernel tile."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    outs = tl.program_id(1) * CHANNELS + tl.arange(0, CHANNELS)
    row_ok = rows < rows_total
    out_ok = outs < c_out
    slice_start = (rows // n).to(tl.int64) * m
    acc = tl.zeros([ROWS, CHANNELS], dtype=ACC)
    slot = 0
    while slot < k:
        index = tl.load(indices_ptr + rows.to(tl.int64) * k + slot, mask=row_ok, other=0)
        weight = tl.load(weights_ptr + rows.to(tl.int64) * k + slot, mask=row_ok, other=0.0).to(ACC)
        first = 0
        while first < c:
            ins = first + tl.arange(0, CHANNELS)
            in_ok = ins < c
            neighbour = tl.load(values_ptr + (slice_start + index)[:, None] * c + ins[None, :],
                                mask=row_ok[:, None] & in_ok[None, :], other=0.0).to(ACC)
            taps = tl.load(kernel_ptr + outs[None, :].to(tl.int64) * c * k + ins[:, None] * k + slot,
                           mask=in_ok[:, None] & out_ok[None, :], other=0.0).to(ACC)
            acc += tl.dot(neighbour * weight[:, None], taps, input_precision="ieee")
            first += CHANNELS
        slot += 1
    if HAS_BIAS:
        acc += tl.load(bias_ptr + outs, mask=out_ok, other=0.0).to(ACC)[None, :]
    tl.store(output_ptr + rows.to(tl.int64)[:, None] * c_out + outs[None, :], acc.to(output_ptr.dtype.element_ty),
             mask=row_ok[:, None] & out_ok[None, :])


@triton.jit
def _standard_through_kernel(grad_output_ptr, kernel_ptr, rows, row_ok, ins, in_ok, slot, c, c_out, k,
                             ROWS: tl.constexpr, CHANNELS: tl.constexpr, ACC: tl.constexpr):
    """[ROWS, CHANNELS]: dy pulled back through the slot's kernel, sum_o dy[row, o] * kernel[o, c, slot]."""
    pulled = tl.zeros([ROWS, CHANNELS], dtype=ACC)
    first = 0
    while first < c_out:
        outs = first + tl.arange(0, CHANNELS)
        out_ok = outs < c_out
        dy = tl.load(grad_output_ptr + rows.to(tl.int64)[:, None] * c_out + outs[None, :],
                     mask=row_ok[:, None] & out_ok[None, :], other=0.0).to(ACC)
        taps = tl.load(kernel_ptr + outs[:, None].to(tl.int64) * c * k + ins[None, :] * k + slot,
                       mask=out_ok[:, None] & in_ok[None, :], other=0.0).to(ACC)
        pulled += tl.dot(dy, taps, input_precision="ieee")
        first += CHANNELS
    return pulled


@triton.jit
def _standard_weights_gradient_kernel(grad_output_ptr, values_ptr, indices_ptr, kernel_ptr, grad_weights_ptr,
                                      rows_total, n, m, c, c_out, k, ROWS: tl.constexpr, CHANNELS: tl.constexpr,
                                      ACC: tl.constexpr):
    """grad_weights[row, slot] = sum_c values[slice, index, c] * sum_o dy[row, o] * kernel[o, c, slot]."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    slot = tl.program_id(1)
    row_ok = rows < rows_total
    slice_start = (rows // n).to(tl.int64) * m
    index = tl.load(indices_ptr + rows.to(tl.int64) * k + slot, mask=row_ok, other=0)
    acc = tl.zeros([ROWS], dtype=ACC)
    first = 0
    while first < c:
        ins = first + tl.arange(0, CHANNELS)
        in_ok = ins < c
        pulled = _standard_through_kernel(grad_output_ptr, kernel_ptr, rows, row_ok, ins, in_ok, slot, c, c_out, k,
                                          ROWS, CHANNELS, ACC)
        neighbour = tl.load(values_ptr + (slice_start + index)[:, None] * c + ins[None, :],
                            mask=row_ok[:, None] & in_ok[None, :], other=0.0).to(ACC)
        acc += tl.sum(pulled * neighbour, axis=1)
        first += CHANNELS
    tl.store(grad_weights_ptr + rows.to(tl.int64) * k + slot, acc.to(grad_weights_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def _standard_kernel_gradient_kernel(grad_output_ptr, values_ptr, weights_ptr, indices_ptr, partial_ptr,
                                     rows_total, n, m, c, c_out, k, rows_per_chunk, ROWS: tl.constexpr,
                                     CHANNELS: tl.constexpr, ACC: tl.constexpr):
    """partial[chunk, o, c, slot] = sum over the chunk's rows of dy[row, o] * w[row, slot] *
    values[slice, index, c]: one program per block of output and input channels and (chunk, slot),
    its row blocks in order; kernel_gradient() sums the chunks in a fixed order."""
    outs = tl.program_id(0) * CHANNELS + tl.arange(0, CHANNELS)
    ins = tl.program_id(1) * CHANNELS + tl.arange(0, CHANNELS)
    chunk = tl.program_id(2) // k
    slot = tl.program_id(2) % k
    out_ok = outs < c_out
    in_ok = ins < c
    acc = tl.zeros([CHANNELS, CHANNELS], dtype=ACC)
    first = chunk * rows_per_chunk
    end = tl.minimum(first + rows_per_chunk, rows_total)
    while first < end:
        rows = first + tl.arange(0, ROWS)
        row_ok = rows < end
        slice_start = (rows // n).to(tl.int64) * m
        index = tl.load(indices_ptr + rows.to(tl.int64) * k + slot, mask=row_ok, other=0)
        weight = tl.load(weights_ptr + rows.to(tl.int64) * k + slot, mask=row_ok, other=0.0).to(ACC)
        neighbour = tl.load(values_ptr + (slice_start + index)[:, None] * c + ins[None, :],
                            mask=row_ok[:, None] & in_ok[None, :], other=0.0).to(ACC)
        dy = tl.load(grad_output_ptr + rows.to(tl.int64)[:, None] * c_out + outs[None, :],
                     mask=row_ok[:, None] & out_ok[None, :], other=0.0).to(ACC)
        acc += tl.dot(tl.trans(dy), neighbour * weight[:, None], input_precision="ieee")
        first += ROWS
    tl.store(partial_ptr + ((chunk.to(tl.int64) * c_out + outs[:, None]) * c + ins[None, :]) * k + slot,
             acc, mask=out_ok[:, None] & in_ok[None, :])


@triton.jit
def _standard_values_gradient_kernel(grad_output_ptr, weights_ptr, kernel_ptr, order_ptr, run_start_ptr,
                                     grad_values_ptr, c, c_out, k, CHANNELS: tl.constexpr, ACC: tl.constexpr):
    """grad_values[slice, row, c] = sum over the slots that read this row, in slot order, of
    w[slot] * sum_o dy[slot // k, o] * kernel[o, c, slot % k]."""
    value_row = tl.program_id(0)
    ins = tl.program_id(1) * CHANNELS + tl.arange(0, CHANNELS)
    in_ok = ins < c
    position = tl.load(run_start_ptr + value_row)
    end = tl.load(run_start_ptr + value_row + 1)
    acc = tl.zeros([CHANNELS], dtype=ACC)
    while position < end:
        slot_index = tl.load(order_ptr + position).to(tl.int32)  # within 32 bits, as above
        query_row = slot_index // k
        slot = slot_index - query_row * k
        weight = tl.load(weights_ptr + slot_index).to(ACC)
        first = 0
        while first < c_out:
            outs = first + tl.arange(0, CHANNELS)
            out_ok = outs < c_out
            dy = tl.load(grad_output_ptr + query_row.to(tl.int64) * c_out + outs, mask=out_ok, other=0.0).to(ACC)
            taps = tl.load(kernel_ptr + outs[:, None].to(tl.int64) * c * k + ins[None, :] * k + slot,
                           mask=out_ok[:, None] & in_ok[None, :], other=0.0).to(ACC)
            acc += weight * tl.sum(dy[:, None] * taps, axis=0)
            first += CHANNELS
        position += 1
    tl.store(grad_values_ptr + value_row.to(tl.int64) * c + ins, acc.to(grad_values_ptr.dtype.element_ty), mask=in_ok)
