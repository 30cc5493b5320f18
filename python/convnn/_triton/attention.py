"""Fused GPU kernels of knn_attention, in Triton (issue 25 §1): the forward (select, rho and a
depthwise aggregation in one kernel), rho and the aggregation in one kernel after a select of its
own (the composed forward, where knn_select scores on tensor cores: _rho_aggregate_kernel), and the
backward's step from the output's gradient to the scores' for softmax rho (the aggregation's
weights gradient and the softmax-rho backward in one kernel; the select and aggregation backward
kernels do the rest).

The forward: per program, one slice and a block of query rows: the running top-K of
select.py (the same jit function, so the same selection rule), then rho over the K slots and the
weighted sum of the selected value rows, with the [G,N,K] scores, indices and weights held on chip
until they are written once (the op returns them, and the backward reads them).

    output[g, i, c] = sum over slots s of weights[g, i, s] * values[g, indices[g, i, s], c] * kernel[c, s] + bias[c]

It follows the composed ops exactly (select -> rho -> knn_aggregate, as src/ops/composite/knn_attention_composed.cpp
composes them): rho sees the scores rounded to the op's dtype, the aggregation the weights rounded
to it, and the slots are summed in their output order with the aggregation kernel's products
(weight * value * tap), in float32. Rows that met a NaN or +inf score come out NaN (scores, weights
and output), as on every path. A standard kernel [C',C,K] is not fused (its channel mixing needs a
[C,C'] tile per slot on chip): knn_attention composes then.

Written as aggregate.py and select.py: each output element written by one program, no atomics,
every load and store masked to its tensor's extent, `while` loops over runtime bounds, ranking
scores by tl.dot in IEEE float32. Queries, keys, values, kernel and bias are read in the compiled
kernel's input dtype (select.INPUT_DTYPES: float32, bfloat16 or float16, converted to float32 in
registers; the launcher converts an additive mask to float32), and the outputs are written in the
op's dtype (select.store_as), so one compiled kernel per similarity, slot width, mask kind and input
dtype serves every rho and slot order (scripts/triton_aot.py embeds them).
"""
import torch
import triton
import triton.language as tl

from . import row_chunks, select

CHANNELS = 32  # value channels per step of the aggregation
RHO_CODES = {"uniform": 0, "mean": 1, "softmax": 2}  # in the C++ enum's order (a test holds it to rho_names())
_UNIFORM, _MEAN, _SOFTMAX = (tl.constexpr(RHO_CODES[name]) for name in ("uniform", "mean", "softmax"))
# Value channels per step of the forward's aggregation where the running top-K is held a query row
# per thread (select.held_per_thread: one warp of 32 rows): a [32, 32] step held 32 accumulators and
# 32 gather addresses per thread beside the selection's state, and ptxas spilled at 255 registers.
THREAD_CHANNELS = 8
# The widest running top-K whose aggregation takes each row's slots as columns of its thread, the
# slots unrolled (_aggregate_columns), as the backward's row kernel does (attention_backward._rows);
# wider ones extract a slot per step (_aggregate). At 16 slots ptxas spilled 3.8 KB in the forward
# (sm_80 and sm_90, the unmasked specialisations): it hoists every slot's loads.
COLUMN_SLOTS = 8
_COLUMN_SLOTS = tl.constexpr(COLUMN_SLOTS)


def forward_channels(slots, shared_set=False):
    """Value channels per step of the fused forward's aggregation at this width of the running top-K
    (select.design's; shared_set: of the set shared by a row's threads at any width)."""
    return THREAD_CHANNELS if select.held_per_thread(slots) and not shared_set else CHANNELS


# Launch options of the softmax scores gradient: Triton's default four warps, at most 96 registers.
# Uncapped, ptxas chose 72 at 64 slots and spilled 8 bytes (sm_80) once the kernel read strided
# rows (issue 38 §1: a row's incoming-gradient and value offsets held beside the loop); with the
# cap, 79-87 registers and no spill at every width and dtype (scripts/triton_compile_check.py).
SCORES_GRADIENT_OPTIONS = {"num_warps": 4, "maxnreg": 96}

# The op's dtype (select.py's codes): the kernel writes its outputs in it, and rounds the scores
# before rho and the weights before the aggregation to it, as the composed ops do.
DTYPE_CODES = select.DTYPE_CODES
# The backward's kernels (the softmax scores gradient here, attention_backward.py's two) read their
# inputs and write their gradients in the op's dtype, compiled once per dtype
# (specialisations.backward_pointers): no float32 copies before them or conversions after. The
# forward's kernels read select.INPUT_DTYPES.
BACKWARD_IN_OPS_DTYPE = True


@triton.jit
def _rounded_to(x, DTYPE: tl.constexpr):
    """x (float32) rounded to DTYPE (a compile-time type: the backward's kernels are compiled per
    dtype) and back; float32 leaves it as it is."""
    return x.to(DTYPE).to(tl.float32)


@triton.jit
def _rounded(x, dtype_code):
    """x (float32) rounded to the op's dtype (a run-time code: the forward's float32 kernels serve
    every dtype) and back."""
    return tl.where(dtype_code == select.BFLOAT16_CODE, x.to(tl.bfloat16).to(tl.float32),
                    tl.where(dtype_code == select.FLOAT16_CODE, x.to(tl.float16).to(tl.float32), x))


@triton.jit
def _rho(scores, in_k, rho, temperature, ROWS: tl.constexpr, SLOTS: tl.constexpr):
    """Weights [ROWS, SLOTS] from scores [ROWS, SLOTS] (docs/operator.md, src/ops/reference/rho_forms.cpp):
    masked (-inf) slots and the slots past K weigh 0; uniform 1, mean 1/(valid slots), softmax of
    (score - largest) / temperature over the valid slots; a row with no valid slot weighs 0."""
    valid = in_k & (scores != float("-inf"))
    ones = valid.to(tl.float32)
    count = tl.sum(ones, 1)
    if rho == _UNIFORM:
        weights = ones
    elif rho == _MEAN:
        weights = tl.math.div_rn(ones, tl.maximum(count, 1.0)[:, None])
    elif rho == _SOFTMAX:
        # The largest valid score (0 in a row with none, where every weight is 0: no -inf - -inf).
        largest = tl.where(count > 0, tl.max(tl.where(in_k, scores, float("-inf")), 1), 0.0)
        z = tl.math.div_rn(scores - largest[:, None], tl.full([ROWS, SLOTS], temperature, tl.float32))
        e = tl.where(valid, tl.exp(z), 0.0)
        total = tl.sum(e, 1)
        weights = tl.math.div_rn(e, tl.where(count > 0, total, 1.0)[:, None])
    else:
        # A code no branch knows (rho is a runtime argument, so no compile-time stop): NaN weights,
        # which the first-call check and every test catch, never another rho's arithmetic. The C++
        # launcher's rho_code is a switch over the enum that -Werror=switch keeps complete.
        weights = tl.full([ROWS, SLOTS], float("nan"), tl.float32)
    return weights


@triton.jit
def _output_positions(top_index, in_k, k, index_order, ROWS: tl.constexpr, SLOTS: tl.constexpr):
    """Where each slot of the running top-K (best first) goes in the op's outputs: the same place,
    or with index_order its rank among the row's K indices (they are distinct)."""
    slots = tl.arange(0, SLOTS)
    positions = slots[None, :] + tl.zeros([ROWS, SLOTS], tl.int32)
    if index_order != 0:
        slot = 0
        while slot < k:
            here = slots[None, :] == slot
            index = tl.sum(tl.where(here, top_index, 0), 1)
            rank = tl.sum((in_k & (top_index < index[:, None])).to(tl.int32), 1)
            positions = tl.where(here, rank[:, None], positions)
            slot += 1
    return positions


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, kernel_ptr, bias_ptr, mask_ptr,
                      output_ptr, scores_ptr, indices_ptr, weights_ptr,
                      n, m, d, c, k, mask_slice_stride, slices_per_mask_slice, similarity_constant, rho, temperature,
                      index_order, has_bias, dtype_code,
                      heads, q_batch_stride, q_head_stride, q_row_stride, k_batch_stride, k_head_stride, k_row_stride,
                      v_batch_stride, v_head_stride, v_row_stride, out_batch_stride, out_head_stride, out_row_stride,
                      SIMILARITY: tl.constexpr, MASK: tl.constexpr, ROWS: tl.constexpr, CANDIDATES: tl.constexpr,
                      SLOTS: tl.constexpr, FEATURES: tl.constexpr, CHANNELS: tl.constexpr,
                      SHARED_SET: tl.constexpr = False):
    # Queries, keys, values and the output in place, any strides but the features' (their slices'
    # starts by row_chunks.slice_starts: the launcher's RowLayouts; the [B, N, H, C] output of [B, H,
    # N, D] inputs, say); the scores, indices and weights contiguous [G, N, K]. The outputs' pointers
    # are compiled as float32 and written in the op's dtype (select.store_as casts them first), so
    # their slice starts are element offsets added after the cast, never steps of a float32 pointer.
    block = tl.program_id(0)
    g = tl.program_id(1).to(tl.int64)
    rows = block * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n
    q_ptr += row_chunks.slice_starts(g, heads, q_batch_stride, q_head_stride)
    k_ptr += row_chunks.slice_starts(g, heads, k_batch_stride, k_head_stride)
    v_ptr += row_chunks.slice_starts(g, heads, v_batch_stride, v_head_stride)
    mask_ptr += select.mask_slice_start(g, mask_slice_stride, slices_per_mask_slice)
    top_keys, top_index, unrankable = select._running_top_k(q_ptr, k_ptr, mask_ptr, rows, row_ok, m, d, k,
                                                            q_row_stride, k_row_stride, similarity_constant,
                                                            SIMILARITY, MASK, ROWS, CANDIDATES, SLOTS, FEATURES,
                                                            SHARED_SET)
    slots = tl.arange(0, SLOTS)
    in_k = slots[None, :] < k
    scores = _rounded(select._reported_scores(top_keys, unrankable, SIMILARITY), dtype_code)
    weights = _rounded(_rho(scores, in_k, rho, temperature, ROWS, SLOTS), dtype_code)
    nan_row = unrankable[:, None] != 0
    weights = tl.where(nan_row, float("nan"), weights)
    positions = _output_positions(top_index, in_k, k, index_order, ROWS, SLOTS)
    out = (g * n + rows).to(tl.int64)[:, None] * k + positions
    written = row_ok[:, None] & in_k
    select.store_as(scores_ptr, out, scores, written, dtype_code)
    tl.store(indices_ptr + out, top_index.to(tl.int64), mask=written)
    select.store_as(weights_ptr, out, weights, written, dtype_code)
    out_rows = row_chunks.slice_starts(g, heads, out_batch_stride, out_head_stride) + rows.to(tl.int64) * out_row_stride
    # Value rows of whole chunks on 16-byte boundaries load as vectors (row_chunks.py).
    whole = row_chunks.on_16_bytes(v_ptr) & row_chunks.whole_rows(c, v_batch_stride, v_head_stride, v_row_stride,
                                                                  CHANNELS)
    _aggregate_slots(v_ptr, kernel_ptr, bias_ptr, output_ptr, v_row_stride, whole, row_ok, out_rows, unrankable,
                     positions, top_index, weights, in_k, m, c, k, has_bias, dtype_code, ROWS, SLOTS, CHANNELS,
                     SLOTS <= _COLUMN_SLOTS and not SHARED_SET)


@triton.jit
def _aggregate_slots(v_ptr, kernel_ptr, bias_ptr, output_ptr, v_row_stride, whole, row_ok, out_rows, unrankable,
                     positions, top_index, weights, in_k, m, c, k, has_bias, dtype_code, ROWS: tl.constexpr,
                     SLOTS: tl.constexpr, CHANNELS: tl.constexpr, COLUMNS: tl.constexpr):
    """The block's output rows from its slots' indices and weights [ROWS, SLOTS] (the slots summed in
    the order `positions` gives): with COLUMNS (a row's slots held by its thread, K <= COLUMN_SLOTS)
    as columns of the thread, on vector loads where the value rows are `whole` chunks on 16 bytes;
    else a slot at a time."""
    if COLUMNS:
        index_columns, weight_columns = _columns_in_output_order(top_index, weights, positions, SLOTS)
        if whole:
            _aggregate_columns(v_ptr, kernel_ptr, bias_ptr, output_ptr, v_row_stride, row_ok, out_rows, unrankable,
                               index_columns, weight_columns, m, c, k, has_bias, dtype_code, ROWS, CHANNELS, True)
        else:
            _aggregate_columns(v_ptr, kernel_ptr, bias_ptr, output_ptr, v_row_stride, row_ok, out_rows, unrankable,
                               index_columns, weight_columns, m, c, k, has_bias, dtype_code, ROWS, CHANNELS, False)
    else:
        _aggregate(v_ptr, kernel_ptr, bias_ptr, output_ptr, v_row_stride, row_ok, out_rows, unrankable, positions,
                   top_index, weights, in_k, m, c, k, has_bias, dtype_code, ROWS, CHANNELS)


@triton.jit
def _columns_in_output_order(top_index, weights, positions, SLOTS: tl.constexpr):
    """The slots' indices and weights [ROWS, SLOTS] as two tuples of SLOTS columns [ROWS], column p the
    slot written at output position p (positions: a permutation of each row's slots)."""
    index_columns = ()
    weight_columns = ()
    for position in tl.static_range(SLOTS):
        here = positions == position
        index_columns = index_columns + (tl.sum(tl.where(here, top_index, 0), 1),)
        weight_columns = weight_columns + (tl.sum(tl.where(here, weights, 0.0), 1),)
    return index_columns, weight_columns


@triton.jit
def _aggregate_columns(v_ptr, kernel_ptr, bias_ptr, output_ptr, v_row_stride, row_ok, out_rows, unrankable,
                       index_columns, weight_columns, m, c, k, has_bias, dtype_code, ROWS: tl.constexpr,
                       CHANNELS: tl.constexpr, WHOLE: tl.constexpr):
    """_aggregate where each row's slots are held by its thread (the columns of _columns_in_output_order):
    the same products and order, the K positions unrolled. Extracting a slot from [ROWS, SLOTS] tiles
    for every position of every block of channels took 48 of the loop's 232 SASS per slot in
    shuffles, and as much again in the sums (sm_90, K <= 8)."""
    first = 0
    while first < c:
        channels = first + tl.arange(0, CHANNELS)
        channel_ok = channels < c
        acc = tl.zeros([ROWS, CHANNELS], dtype=tl.float32)
        for position in tl.static_range(len(index_columns)):
            if position < k:
                index = index_columns[position]
                # An unrankable row's indices may be past the candidates: read nothing there.
                neighbour = row_chunks.load(v_ptr, index.to(tl.int64) * v_row_stride, first, c, row_ok & (index < m),
                                            WHOLE, CHANNELS)
                tap = tl.load(kernel_ptr + channels * k + position, mask=channel_ok, other=0.0).to(tl.float32)
                acc += weight_columns[position][:, None] * neighbour * tap[None, :]
        _write_output(bias_ptr, output_ptr, out_rows, row_ok, unrankable, acc, channels, channel_ok, has_bias,
                      dtype_code)
        first += CHANNELS


@triton.jit
def _write_output(bias_ptr, output_ptr, out_rows, row_ok, unrankable, acc, channels, channel_ok, has_bias, dtype_code):
    """A block of output channels of the rows starting at out_rows (element offsets): acc plus the
    bias, NaN in unrankable rows, in the op's dtype."""
    if has_bias != 0:
        acc += tl.load(bias_ptr + channels, mask=channel_ok, other=0.0).to(tl.float32)[None, :]
    acc = tl.where(unrankable[:, None] != 0, float("nan"), acc)
    select.store_as(output_ptr, out_rows[:, None] + channels[None, :], acc, row_ok[:, None] & channel_ok[None, :],
                    dtype_code)


@triton.jit
def _aggregate(v_ptr, kernel_ptr, bias_ptr, output_ptr, v_row_stride, row_ok, out_rows, unrankable, positions,
               top_index, weights, in_k, m, c, k, has_bias, dtype_code, ROWS: tl.constexpr, CHANNELS: tl.constexpr):
    """The block's output rows: CHANNELS at a time, the slots in output order (as knn_aggregate sums
    them), in float32 from values, kernel and bias of the kernel's input dtype (select.INPUT_DTYPES,
    converted in registers); written in the op's dtype; NaN in unrankable rows.

    The input dtype is the compiled kernel's: through one run-time branch per dtype around this loop,
    Triton 3.6 failed to compile the distances' unmasked specialisations
    (TritonGPURemoveLayoutConversions: "operand does not dominate this use"), and through a
    predicated load per dtype the loop's SASS grew from 111 to 198 per slot (sm_90)."""
    first = 0
    while first < c:
        channels = first + tl.arange(0, CHANNELS)
        channel_ok = channels < c
        acc = tl.zeros([ROWS, CHANNELS], dtype=tl.float32)
        position = 0
        while position < k:
            here = in_k & (positions == position)
            index = tl.sum(tl.where(here, top_index, 0), 1)
            weight = tl.sum(tl.where(here, weights, 0.0), 1)
            # An unrankable row's indices may be past the candidates: read nothing there.
            read = row_ok & (index < m)
            neighbour = tl.load(v_ptr + index.to(tl.int64)[:, None] * v_row_stride + channels[None, :],
                                mask=read[:, None] & channel_ok[None, :], other=0.0).to(tl.float32)
            tap = tl.load(kernel_ptr + channels * k + position, mask=channel_ok, other=0.0).to(tl.float32)
            acc += weight[:, None] * neighbour * tap[None, :]
            position += 1
        _write_output(bias_ptr, output_ptr, out_rows, row_ok, unrankable, acc, channels, channel_ok, has_bias,
                      dtype_code)
        first += CHANNELS


# The composed forward's rho and aggregation in one kernel (_rho_aggregate_kernel): query rows per
# program, and a thread's value channels per step, as the fused forward's aggregation takes them
# where its running top-K is held a row per thread.
RHO_AGGREGATE_ROWS = 32


def rho_aggregate_options(slots):
    """Its launch options at this width: a warp per 8 slots, so that a thread holds 8 slots of a row's
    [ROWS, SLOTS] scores, indices and weights, and up to 192 registers. In one warp, ptxas spilled 264
    bytes at 32 slots and 1,056 at 64 (sm_90); with 4 warps at 32 slots and no cap, sm_80's ptxas held
    128 registers and spilled 32 bytes (132-170 registers with the cap, no spill)."""
    return {"num_warps": max(1, slots // 8), "maxnreg": 192}


@triton.jit
def _rho_aggregate_kernel(scores_ptr, indices_ptr, v_ptr, kernel_ptr, bias_ptr, output_ptr, weights_ptr,
                          n, m, c, k, rho, temperature, has_bias, dtype_code,
                          ROWS: tl.constexpr, SLOTS: tl.constexpr, CHANNELS: tl.constexpr):
    # knn_attention's rho and depthwise aggregation after a select of its own (the composition, where
    # knn_select scores on tensor cores: src/ops/composite/knn_attention_composed.cpp asks for this
    # kernel before it composes rho and knn_aggregate). Per slice and block of query rows: the [ROWS,
    # SLOTS] scores and indices read once, the weights made by _rho, rounded to the op's dtype and
    # written, and the output summed from them in registers as the fused forward sums it (so as
    # knn_aggregate sums the written weights). Composed, rho was a dozen ATen passes over the
    # [G, N, K] scores (reference::rho_weights) and the aggregation read the weights back.
    # Contiguous [G, N, K] scores, indices and weights, [G, M, C] values, [G, N, C] output (the
    # composition's folds); the weights and the output written in the op's dtype through pointers
    # compiled as float32 (select.store_as casts them before adding any offset).
    block = tl.program_id(0)
    g = tl.program_id(1).to(tl.int64)
    rows = block * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n
    slots = tl.arange(0, SLOTS)
    in_k = slots[None, :] < k
    read = row_ok[:, None] & in_k
    at = (g * n + rows).to(tl.int64)[:, None] * k + slots[None, :]
    scores = tl.load(scores_ptr + at, mask=read, other=float("-inf")).to(tl.float32)
    top_index = tl.load(indices_ptr + at, mask=read, other=0)
    # A row the select could not rank has NaN scores: its weights and output are NaN, and its indices
    # are not read (m: past the candidates, which the aggregation does not load).
    unrankable = tl.max((read & (scores != scores)).to(tl.int32), 1)
    weights = _rounded(_rho(scores, in_k, rho, temperature, ROWS, SLOTS), dtype_code)
    weights = tl.where(unrankable[:, None] != 0, float("nan"), weights)
    select.store_as(weights_ptr, at, weights, read, dtype_code)
    top_index = tl.where(unrankable[:, None] != 0, m, top_index)
    v_ptr += g * m * c
    out_rows = (g * n + rows).to(tl.int64) * c
    positions = slots[None, :] + tl.zeros([ROWS, SLOTS], tl.int32)  # the select's slot order, kept
    whole = row_chunks.on_16_bytes(v_ptr) & row_chunks.whole(c, CHANNELS)
    _aggregate_slots(v_ptr, kernel_ptr, bias_ptr, output_ptr, c, whole, row_ok, out_rows, unrankable, positions,
                     top_index, weights, in_k, m, c, k, has_bias, dtype_code, ROWS, SLOTS, CHANNELS,
                     SLOTS <= _COLUMN_SLOTS)


@triton.jit
def _weights_gradient(grad_output_ptr, values_ptr, kernel_ptr, indices_ptr, weights_ptr, partial_ptr, block, rows,
                      row_ok, dy_starts, v_starts, v_row_stride, m, c, k, KERNEL_PARTIAL: tl.constexpr,
                      ROWS: tl.constexpr, SLOTS: tl.constexpr,
                      CHANNELS: tl.constexpr, WHOLE: tl.constexpr = False):
    """d weights [ROWS, SLOTS] in float32 (not rounded) as knn_aggregate_backward's weights gradient,

        d weights[row, s] = sum_c dy[row, c] * kernel[c, s] * values[slice, indices[row, s], c],

    the channels CHANNELS at a time, in order; the rows' incoming gradients start at dy_starts, their
    slices' values at v_starts (element offsets, row_chunks.row_starts and slice_starts), value rows
    v_row_stride apart. With KERNEL_PARTIAL, from the same loads, the rows'
    share of d kernel: partial[block, c, s] = sum over the ROWS rows of w[row, s] * values[..] * dy[row, c]
    (knn_aggregate_backward's kernel-gradient product; the caller sums the blocks in a fixed order)."""
    slots = tl.arange(0, SLOTS)
    grad_weights = tl.zeros([ROWS, SLOTS], dtype=tl.float32)
    first = 0
    while first < c:
        channels = first + tl.arange(0, CHANNELS)
        channel_ok = channels < c
        dy = row_chunks.load(grad_output_ptr, dy_starts, first, c, row_ok, WHOLE, CHANNELS)
        slot = 0
        while slot < k:
            index = tl.load(indices_ptr + rows.to(tl.int64) * k + slot, mask=row_ok, other=0)
            # An unrankable row's indices may be past the candidates: read nothing there.
            read = row_ok & (index >= 0) & (index < m)
            neighbour = row_chunks.load(values_ptr, v_starts + index * v_row_stride, first, c, read, WHOLE, CHANNELS)
            tap = tl.load(kernel_ptr + channels * k + slot, mask=channel_ok, other=0.0).to(tl.float32)
            term = tl.sum(dy * neighbour * tap[None, :], axis=1)
            grad_weights = tl.where(slots[None, :] == slot, grad_weights + term[:, None], grad_weights)
            if KERNEL_PARTIAL:
                weight = tl.load(weights_ptr + rows.to(tl.int64) * k + slot, mask=row_ok, other=0.0).to(tl.float32)
                share = tl.sum(weight[:, None] * neighbour * dy, axis=0)
                tl.store(partial_ptr + (block.to(tl.int64) * c + channels) * k + slot, share, mask=channel_ok)
            slot += 1
        first += CHANNELS
    return grad_weights


@triton.jit
def _slot_block(rows_total, k, ROWS: tl.constexpr, SLOTS: tl.constexpr):
    """This program's block of ROWS rows of the flattened G*N and its [ROWS, SLOTS] slot tile: (block,
    rows, row_ok, slot tile mask, slot tile offsets into a [G*N, K] tensor)."""
    block = tl.program_id(0)
    rows = block * ROWS + tl.arange(0, ROWS)
    row_ok = rows < rows_total
    slots = tl.arange(0, SLOTS)
    both_ok = row_ok[:, None] & (slots[None, :] < k)
    return block, rows, row_ok, both_ok, rows.to(tl.int64)[:, None] * k + slots[None, :]


@triton.jit
def _softmax_backward(grad_weights, weights, temperature, DTYPE: tl.constexpr, ROWS: tl.constexpr,
                      SLOTS: tl.constexpr):
    """d scores [ROWS, SLOTS] from d weights (float32, not rounded) and the softmax weights, as the
    softmax-rho backward (src/ops/generic/knn_attention_generic.cpp), each rounded to the op's dtype
    DTYPE where the composed steps round:

        d scores[row, s] = weights[row, s] * (d weights[row, s] - sum_t weights[row, t] * d weights[row, t]) / temperature"""
    grad_weights = _rounded_to(grad_weights, DTYPE)
    centred = grad_weights - tl.sum(weights * grad_weights, 1)[:, None]
    return _rounded_to(tl.math.div_rn(weights * centred, tl.full([ROWS, SLOTS], temperature, tl.float32)), DTYPE)


@triton.jit
def _softmax_scores_gradient_kernel(grad_output_ptr, values_ptr, kernel_ptr, indices_ptr, weights_ptr, grad_scores_ptr,
                                    rows_total, n, m, c, k, temperature, heads, dy_batch_stride, dy_head_stride,
                                    dy_row_stride, v_batch_stride, v_head_stride, v_row_stride,
                                    ROWS: tl.constexpr, SLOTS: tl.constexpr, CHANNELS: tl.constexpr):
    """The backward's fused step from the aggregation's incoming gradient to the scores' (softmax rho,
    depthwise kernel), with d(weights) held on chip: _weights_gradient, then _softmax_backward. One
    program per block of ROWS rows of the flattened G*N; inputs and d scores in the op's dtype (a
    compiled kernel per dtype; half precision converts to float32 in registers, exactly). The
    fused backward of attention_backward.py goes on from here to the query and key gradients for the
    dot products; this kernel serves the other similarities, whose select backward composes."""
    block, rows, row_ok, both_ok, slot_offsets = _slot_block(rows_total, k, ROWS, SLOTS)
    dy_starts = row_chunks.row_starts(rows, n, heads, dy_batch_stride, dy_head_stride, dy_row_stride)
    v_starts = row_chunks.slice_starts(rows // n, heads, v_batch_stride, v_head_stride)
    grad_weights = _weights_gradient(grad_output_ptr, values_ptr, kernel_ptr, indices_ptr, weights_ptr, weights_ptr,
                                     block, rows, row_ok, dy_starts, v_starts, v_row_stride, m, c, k, False, ROWS,
                                     SLOTS, CHANNELS)
    weights = tl.load(weights_ptr + slot_offsets, mask=both_ok, other=0.0).to(tl.float32)
    grad_scores = _softmax_backward(grad_weights, weights, temperature, grad_scores_ptr.dtype.element_ty, ROWS,
                                    SLOTS)
    # Already rounded to the op's dtype (_softmax_backward): stored in it exactly.
    tl.store(grad_scores_ptr + slot_offsets, grad_scores.to(grad_scores_ptr.dtype.element_ty), mask=both_ok)
