"""knn_attention's backward in two Triton kernels and one sort (issue 38 §2), for softmax rho, a
depthwise kernel and the dot-product similarities (dot, scaled_dot): the configuration of the
paper's Table 1 and of every ConvNN attention layer's default.

- The row kernel, one program per block of query rows: the aggregation's weights gradient with
  the rows' share of the kernel's gradient from the same loads, the softmax-rho backward, and the
  query gradient d(q_i) = sum over slots of g[i, s] * keys[indices[i, s]] (g the score gradient,
  0 on masked slots, divided by sqrt(D) for scaled_dot). It writes g for the column kernel.
- The inverse index (the launcher's inverse_index: the slots sorted stably by the row they read), built
  once and shared by the values' and the keys' gradients.
- The column kernel, one program per block of key/value rows and block of channels: d(values)
  from w * kernel tap * dy and d(keys) from g * q, each row's slots added in slot order. Its
  blocks take the rows busiest first (the launcher's busiest_first), so a block's rows have runs of about one
  length and no block waits on one much-read row.

Every step follows the composed path (src/ops/composite/knn_attention_composed.cpp: the aggregation's
backward, the fused softmax scores gradient of attention.py, the select backward of select.py)
product for product, rounding to the op's dtype where it rounds, so the two agree to the last bits
of a differently ordered sum (the kernel's gradient: per block of rows here, per chunk of rows
there). No atomics: two backward passes are bitwise equal. Cosine and the distances, uniform and
mean rho, a standard kernel, float64 and K above 64 compose (the choice: src/ops/cuda/triton/attention_launches.cpp's
attention_backward_fits).

The kernels read their inputs and write the three gradients in the op's dtype, a compiled kernel
per dtype (float32 in registers: half precision converts exactly, and the gradients round to
nearest even once, where the launcher's conversion rounded them before): no conversion pass
before or after them (issue 38 §1). The score gradient g and the kernel's partials stay float32.
"""

import triton
import triton.language as tl

from . import attention, row_chunks, select

SIMILARITY_SCALED = {"dot": False, "scaled_dot": True}  # the similarities it takes; whether d scores is divided by sqrt(D)
# Both kernels take one warp of 32 rows per program, a row per lane (issue 38, as select.py's set
# held per thread): at 16 rows over 8 warps each thread held 2-4 elements of a step, and the step's
# index loads, divisions and 64-bit addresses were most of its instructions (the static cost report:
# rows 1718 -> 890, columns 1815 -> 753 warp instructions per query row at Table 1). The widths are
# the widest without a spill at every slot width (ptxas, sm_80 and sm_90): the row kernel spilled at
# 16 channels per step, the column kernel took 233-238 registers at 32.
ROW_ROWS = 32       # query rows per program of the row kernel
ROW_CHANNELS = 8    # channels (and features) per step of the row kernel
COLUMN_ROWS = 32    # key/value rows per program of the column kernel
COLUMN_WIDTH = 16   # channels (values) or features (keys) per program of the column kernel
COMPILE_OPTIONS = {"num_warps": 1}
VECTOR_SLOTS = tl.constexpr(32)  # the widest running top-K whose row kernel has a vector-load body


def compile_options(slots=None):
    """The launch options of the row kernel at this width of the running top-K (None: the column
    kernel): one warp, but two at the widest, where one lane per row of [32, 64] tiles left ptxas
    spilling 48 bytes in half precision (sm_80, dot); with two warps none spills."""
    return {"num_warps": 2} if slots == select.MAX_SLOTS else COMPILE_OPTIONS


@triton.jit
def _rows_kernel(grad_output_ptr, values_ptr, kernel_ptr, indices_ptr, weights_ptr, scores_ptr, keys_ptr,
                 live_ptr, grad_queries_ptr, partial_ptr, rows_total, n, m, c, d, k, temperature, root, heads,
                 dy_batch_stride, dy_head_stride, dy_row_stride, k_batch_stride, k_head_stride, k_row_stride,
                 v_batch_stride, v_head_stride, v_row_stride, dq_batch_stride, dq_head_stride, dq_row_stride,
                 SCALED: tl.constexpr, ROWS: tl.constexpr, SLOTS: tl.constexpr, CHANNELS: tl.constexpr):
    # grad_output, keys and values are read in place and the query gradient written, any strides but
    # the features' (row_chunks.slice_starts: the launcher's RowLayouts).
    # Rows of whole chunks on 16-byte boundaries load as vectors (row_chunks.py); the same body either
    # way. Not at the widest running top-K: the two bodies side by side spilled 48-136 bytes at 64 slots.
    whole = (row_chunks.on_16_bytes(grad_output_ptr) & row_chunks.on_16_bytes(values_ptr)
             & row_chunks.on_16_bytes(keys_ptr) & row_chunks.on_16_bytes(grad_queries_ptr)
             & row_chunks.whole_rows(c, dy_batch_stride, dy_head_stride, dy_row_stride, CHANNELS)
             & row_chunks.whole_rows(c, v_batch_stride, v_head_stride, v_row_stride, CHANNELS)
             & row_chunks.whole_rows(d, k_batch_stride, k_head_stride, k_row_stride, CHANNELS)
             & row_chunks.whole_rows(d, dq_batch_stride, dq_head_stride, dq_row_stride, CHANNELS))
    if SLOTS > VECTOR_SLOTS:
        whole = False
    block, rows, row_ok, both_ok, slot_offsets = attention._slot_block(rows_total, k, ROWS, SLOTS)
    slices = rows // n
    dy_starts = row_chunks.row_starts(rows, n, heads, dy_batch_stride, dy_head_stride, dy_row_stride)
    k_starts = row_chunks.slice_starts(slices, heads, k_batch_stride, k_head_stride)
    v_starts = row_chunks.slice_starts(slices, heads, v_batch_stride, v_head_stride)
    dq_starts = row_chunks.row_starts(rows, n, heads, dq_batch_stride, dq_head_stride, dq_row_stride)
    if whole:
        _rows(grad_output_ptr, values_ptr, kernel_ptr, indices_ptr, weights_ptr, scores_ptr, keys_ptr, live_ptr,
              grad_queries_ptr, partial_ptr, block, rows, row_ok, both_ok, slot_offsets, dy_starts, k_starts,
              k_row_stride, v_starts, v_row_stride, dq_starts, m, c, d, k, temperature, root, SCALED, ROWS, SLOTS,
              CHANNELS, True)
    else:
        _rows(grad_output_ptr, values_ptr, kernel_ptr, indices_ptr, weights_ptr, scores_ptr, keys_ptr, live_ptr,
              grad_queries_ptr, partial_ptr, block, rows, row_ok, both_ok, slot_offsets, dy_starts, k_starts,
              k_row_stride, v_starts, v_row_stride, dq_starts, m, c, d, k, temperature, root, SCALED, ROWS, SLOTS,
              CHANNELS, False)


@triton.jit
def _rows(grad_output_ptr, values_ptr, kernel_ptr, indices_ptr, weights_ptr, scores_ptr, keys_ptr, live_ptr,
          grad_queries_ptr, partial_ptr, block, rows, row_ok, both_ok, slot_offsets, dy_starts, k_starts, k_row_stride,
          v_starts, v_row_stride, dq_starts, m, c, d, k, temperature, root,
          SCALED: tl.constexpr, ROWS: tl.constexpr, SLOTS: tl.constexpr, CHANNELS: tl.constexpr, WHOLE: tl.constexpr):
    if SLOTS <= attention._COLUMN_SLOTS:  # each row's slots as columns of its thread, the slots unrolled
        indices = _slot_columns(indices_ptr, rows, row_ok, k, m, SLOTS)
        grad_weights = _weights_gradient_by_columns(grad_output_ptr, values_ptr, kernel_ptr, weights_ptr, partial_ptr,
                                                    block, rows, row_ok, dy_starts, v_starts, v_row_stride, indices, m,
                                                    c, k, ROWS, SLOTS, CHANNELS, WHOLE)
    else:
        grad_weights = attention._weights_gradient(grad_output_ptr, values_ptr, kernel_ptr, indices_ptr, weights_ptr,
                                                   partial_ptr, block, rows, row_ok, dy_starts, v_starts, v_row_stride,
                                                   m, c, k, True, ROWS, SLOTS, CHANNELS, WHOLE)
    weights = tl.load(weights_ptr + slot_offsets, mask=both_ok, other=0.0).to(tl.float32)
    # The op's dtype is the compiled kernel's (its pointers'): the roundings are compile-time.
    dtype = grad_queries_ptr.dtype.element_ty
    grad_scores = attention._softmax_backward(grad_weights, weights, temperature, dtype, ROWS, SLOTS)
    # The select backward's incoming gradient: none on masked slots, scaled as the score was.
    scores = tl.load(scores_ptr + slot_offsets, mask=both_ok, other=float("-inf")).to(tl.float32)
    live = tl.where(scores == float("-inf"), 0.0, grad_scores)
    if SCALED:
        live = attention._rounded_to(tl.math.div_rn(live, tl.full([ROWS, SLOTS], root, tl.float32)), dtype)
    tl.store(live_ptr + slot_offsets, live, mask=both_ok)
    if SLOTS <= attention._COLUMN_SLOTS:
        _query_gradient_by_columns(keys_ptr, grad_queries_ptr, rows, row_ok, k_starts, k_row_stride, dq_starts, indices,
                                   live, m, d, k, ROWS, SLOTS, CHANNELS, WHOLE)
    else:
        _query_gradient(keys_ptr, indices_ptr, grad_queries_ptr, rows, row_ok, k_starts, k_row_stride, dq_starts, live,
                        m, d, k, ROWS, SLOTS, CHANNELS, WHOLE)


@triton.jit
def _slot_columns(ptr, rows, row_ok, k, other, SLOTS: tl.constexpr, AS_FLOAT: tl.constexpr = False):
    """The block's rows of a [G*N, K] tensor as SLOTS columns [ROWS], a row in its thread (other past K);
    AS_FLOAT: converted to float32 (weights in the op's dtype)."""
    columns = ()
    for slot in tl.static_range(SLOTS):
        column = tl.load(ptr + rows.to(tl.int64) * k + slot, mask=row_ok & (slot < k), other=other)
        if AS_FLOAT:
            column = column.to(tl.float32)
        columns = columns + (column,)
    return columns


@triton.jit
def _weights_gradient_by_columns(grad_output_ptr, values_ptr, kernel_ptr, weights_ptr, partial_ptr, block, rows, row_ok,
                                 dy_starts, v_starts, v_row_stride, indices, m, c, k, ROWS: tl.constexpr,
                                 SLOTS: tl.constexpr,
                                 CHANNELS: tl.constexpr, WHOLE: tl.constexpr):
    """attention._weights_gradient with the rows' kernel-gradient partials, each row's slots held by its
    thread (indices: _slot_columns), the slots unrolled: the same products, sums and order, without
    loading a slot's index and weight again for every block of channels or extracting its column of
    [ROWS, SLOTS] tiles. d weights [ROWS, SLOTS]."""
    weights = _slot_columns(weights_ptr, rows, row_ok, k, 0.0, SLOTS, True)
    grad_weights = (tl.zeros([ROWS], dtype=tl.float32),) * SLOTS
    first = 0
    while first < c:
        channels = first + tl.arange(0, CHANNELS)
        channel_ok = channels < c
        dy = row_chunks.load(grad_output_ptr, dy_starts, first, c, row_ok, WHOLE, CHANNELS)
        for slot in tl.static_range(SLOTS):
            # Past K the index is m: nothing read, nothing added, nothing stored.
            index = indices[slot]
            neighbour = row_chunks.load(values_ptr, v_starts + index * v_row_stride, first, c,
                                        row_ok & (index >= 0) & (index < m), WHOLE, CHANNELS)
            tap = tl.load(kernel_ptr + channels * k + slot, mask=channel_ok & (slot < k), other=0.0).to(tl.float32)
            term = tl.sum(dy * neighbour * tap[None, :], axis=1)
            grad_weights = (grad_weights[:slot] + (tl.where(slot < k, grad_weights[slot] + term, grad_weights[slot]),)
                            + grad_weights[slot + 1:])
            share = tl.sum(weights[slot][:, None] * neighbour * dy, axis=0)
            tl.store(partial_ptr + (block.to(tl.int64) * c + channels) * k + slot, share, mask=channel_ok & (slot < k))
        first += CHANNELS
    return select._stacked(grad_weights)


@triton.jit
def _query_gradient_by_columns(keys_ptr, grad_queries_ptr, rows, row_ok, k_starts, k_row_stride, dq_starts, indices,
                               live, m, d, k, ROWS: tl.constexpr, SLOTS: tl.constexpr, CHANNELS: tl.constexpr,
                               WHOLE: tl.constexpr):
    """_query_gradient with each row's slots held by its thread, the slots unrolled: live's columns taken
    once, not for every block of features."""
    slots = tl.arange(0, SLOTS)
    lives = ()
    for slot in tl.static_range(SLOTS):
        lives = lives + (tl.sum(tl.where(slots[None, :] == slot, live, 0.0), 1),)
    first = 0
    while first < d:
        acc = tl.zeros([ROWS, CHANNELS], dtype=tl.float32)
        for slot in tl.static_range(SLOTS):
            index = indices[slot]
            key = row_chunks.load(keys_ptr, k_starts + index * k_row_stride, first, d,
                                  row_ok & (index >= 0) & (index < m), WHOLE, CHANNELS)
            acc = tl.where(slot < k, acc + lives[slot][:, None] * key, acc)
        row_chunks.store(grad_queries_ptr, dq_starts, first, d, row_ok, acc, WHOLE, CHANNELS)
        first += CHANNELS


@triton.jit
def _query_gradient(keys_ptr, indices_ptr, grad_queries_ptr, rows, row_ok, k_starts, k_row_stride, dq_starts, live, m,
                    d, k, ROWS: tl.constexpr, SLOTS: tl.constexpr, CHANNELS: tl.constexpr, WHOLE: tl.constexpr):
    """d queries of the block's rows: sum over slots of live * the selected key row, in slot order,
    CHANNELS features at a time."""
    slots = tl.arange(0, SLOTS)
    first = 0
    while first < d:
        acc = tl.zeros([ROWS, CHANNELS], dtype=tl.float32)
        slot = 0
        while slot < k:
            index = tl.load(indices_ptr + rows.to(tl.int64) * k + slot, mask=row_ok, other=0)
            read = row_ok & (index >= 0) & (index < m)
            key = row_chunks.load(keys_ptr, k_starts + index * k_row_stride, first, d, read, WHOLE, CHANNELS)
            weight = tl.sum(tl.where(slots[None, :] == slot, live, 0.0), 1)
            acc += weight[:, None] * key
            slot += 1
        row_chunks.store(grad_queries_ptr, dq_starts, first, d, row_ok, acc, WHOLE, CHANNELS)
        first += CHANNELS


@triton.jit
def _columns_kernel(grad_output_ptr, queries_ptr, weights_ptr, taps_ptr, live_ptr, order_ptr, run_start_ptr,
                    row_order_ptr, grad_values_ptr, grad_keys_ptr, rows_total, c, d, k, value_parts, n, m, heads,
                    dy_batch_stride, dy_head_stride, dy_row_stride, q_batch_stride, q_head_stride, q_row_stride,
                    dv_batch_stride, dv_head_stride, dv_row_stride, dk_batch_stride, dk_head_stride, dk_row_stride,
                    ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """Programs (row block, part): parts below value_parts are d values' channel blocks, the rest d
    keys' feature blocks. A block takes ROWS consecutive rows of row_order (the launcher's busiest_first: the rows by
    run length, longest first), so that its rows' runs are about as long as each other; each row
    walks its run [run_start[row], run_start[row + 1]) of the inverse index in order, and the block
    steps as many times as its longest run. grad_output and queries are read in place and the
    gradients written, any strides but the features' (row_chunks.slice_starts: the launcher's
    RowLayouts): a key/value row of slice g reads query rows of slice g only. taps: the depthwise
    kernel transposed, [K, C] contiguous (the launcher's copy), so that a slot's taps for a block of
    channels are one row's chunk, read as vectors, where [C, K] took a load per channel."""
    positions = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    part = tl.program_id(1)
    row_ok = positions < rows_total
    rows = tl.load(row_order_ptr + positions, mask=row_ok, other=0)
    start = tl.load(run_start_ptr + rows, mask=row_ok, other=0)
    length = tl.load(run_start_ptr + rows + 1, mask=row_ok, other=0) - start
    # Each row's slice: the first of its query rows (flat, as the slots number them) and where the
    # slice starts in grad_output and queries.
    slices = rows // m
    first_query = slices * n
    # Rows of whole chunks on 16-byte boundaries load and store as vectors (row_chunks.py).
    if part < value_parts:
        dy_starts = row_chunks.slice_starts(slices, heads, dy_batch_stride, dy_head_stride)
        dv_starts = row_chunks.row_starts(rows, m, heads, dv_batch_stride, dv_head_stride, dv_row_stride)
        if (row_chunks.on_16_bytes(grad_output_ptr) & row_chunks.on_16_bytes(grad_values_ptr)
                & row_chunks.on_16_bytes(taps_ptr)
                & row_chunks.whole_rows(c, dy_batch_stride, dy_head_stride, dy_row_stride, WIDTH)
                & row_chunks.whole_rows(c, dv_batch_stride, dv_head_stride, dv_row_stride, WIDTH)):
            _value_rows(grad_output_ptr, weights_ptr, taps_ptr, order_ptr, grad_values_ptr, row_ok, start, length,
                        first_query, dy_starts, dy_row_stride, dv_starts, part * WIDTH, c, k, True, ROWS, WIDTH)
        else:
            _value_rows(grad_output_ptr, weights_ptr, taps_ptr, order_ptr, grad_values_ptr, row_ok, start, length,
                        first_query, dy_starts, dy_row_stride, dv_starts, part * WIDTH, c, k, False, ROWS, WIDTH)
    else:
        q_starts = row_chunks.slice_starts(slices, heads, q_batch_stride, q_head_stride)
        dk_starts = row_chunks.row_starts(rows, m, heads, dk_batch_stride, dk_head_stride, dk_row_stride)
        if (row_chunks.on_16_bytes(queries_ptr) & row_chunks.on_16_bytes(grad_keys_ptr)
                & row_chunks.whole_rows(d, q_batch_stride, q_head_stride, q_row_stride, WIDTH)
                & row_chunks.whole_rows(d, dk_batch_stride, dk_head_stride, dk_row_stride, WIDTH)):
            _key_rows(queries_ptr, live_ptr, order_ptr, grad_keys_ptr, row_ok, start, length, first_query, q_starts,
                      q_row_stride, dk_starts, (part - value_parts) * WIDTH, d, k, True, ROWS, WIDTH)
        else:
            _key_rows(queries_ptr, live_ptr, order_ptr, grad_keys_ptr, row_ok, start, length, first_query, q_starts,
                      q_row_stride, dk_starts, (part - value_parts) * WIDTH, d, k, False, ROWS, WIDTH)


@triton.jit
def _value_rows(grad_output_ptr, weights_ptr, taps_ptr, order_ptr, grad_values_ptr, row_ok, start, length,
                first_query, dy_starts, dy_row_stride, dv_starts, first, c, k, WHOLE: tl.constexpr, ROWS: tl.constexpr,
                WIDTH: tl.constexpr):
    """d values of the block's rows, channels first .. first + WIDTH - 1: sum over each row's run of
    weight * tap * dy, in run order (taps [K, C]: _columns_kernel)."""
    acc = tl.zeros([ROWS, WIDTH], dtype=tl.float32)
    longest = tl.max(length, 0)
    step = 0
    while step < longest:
        taking = step < length
        # A flattened [G*N*K] slot, within 32 bits (attention_backward_fits): int64 division is a long subroutine.
        slot_index = tl.load(order_ptr + start + step, mask=taking, other=0).to(tl.int32)
        query_row = slot_index // k
        weight = tl.load(weights_ptr + slot_index, mask=taking, other=0.0).to(tl.float32)
        tap = row_chunks.load(taps_ptr, (slot_index - query_row * k).to(tl.int64) * c, first, c, taking, WHOLE, WIDTH)
        dy = row_chunks.load(grad_output_ptr, dy_starts + (query_row - first_query).to(tl.int64) * dy_row_stride, first,
                             c, taking, WHOLE, WIDTH)
        acc += weight[:, None] * tap * dy
        step += 1
    row_chunks.store(grad_values_ptr, dv_starts, first, c, row_ok, acc, WHOLE, WIDTH)


@triton.jit
def _key_rows(queries_ptr, live_ptr, order_ptr, grad_keys_ptr, row_ok, start, length, first_query, q_starts,
              q_row_stride, dk_starts, first, d, k, WHOLE: tl.constexpr, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """d keys of the block's rows, features first .. first + WIDTH - 1: sum over each row's run of
    g * q, in run order."""
    acc = tl.zeros([ROWS, WIDTH], dtype=tl.float32)
    longest = tl.max(length, 0)
    step = 0
    while step < longest:
        taking = step < length
        slot_index = tl.load(order_ptr + start + step, mask=taking, other=0).to(tl.int32)
        live = tl.load(live_ptr + slot_index, mask=taking, other=0.0)
        query = row_chunks.load(queries_ptr, q_starts + (slot_index // k - first_query).to(tl.int64) * q_row_stride,
                                first, d, taking, WHOLE, WIDTH)
        acc += live[:, None] * query
        step += 1
    row_chunks.store(grad_keys_ptr, dk_starts, first, d, row_ok, acc, WHOLE, WIDTH)
