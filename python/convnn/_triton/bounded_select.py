"""knn_select's scores on tensor cores with an exact re-rank (issue 41): the IEEE kernel's indices,
ties, slot order and NaN rows, bit for bit, from inexact scores.

select.py scores every pair in IEEE float32 on CUDA cores, so that a GPU ranks exactly as the CPU.
At long N those scores are the whole cost. Here a tile's scores come from tensor cores (bfloat16 and
float16 inputs as they are, float32 through FLOAT32_PRECISION), each with a bound on its distance
from the IEEE kernel's score (error_bound: docs/operator.md, "Scores on tensor cores", derives it
and states the accumulation model it assumes). Per query row:

1. The running set of the HELD largest *upper bounds* (score + bound, through the similarity's key
   and the mask: both keep order), packed with their indices (select.entered: the gate and rounds
   of the set shared by a row's threads), behind a float gate that lets a tile skip all that when
   none of its pairs reaches its row's least held bound. A candidate outside the set has an upper
   bound no larger than the set's least, u_min.
2. The held candidates re-scored exactly, in the IEEE kernel's order of operations (a float32 FMA
   chain over the features in order: what tl.dot(input_precision="ieee") lowers to), ranked by the
   exact packed keys (larger first, the lower index on a tie). Let x_K be the K-th exact key.
3. If u_min < x_K, every candidate outside the set ranks strictly below the K-th (its exact key is
   at most its upper bound), so the set's K best are the row's K best, ties included: the row is
   settled and written. So is a row whose every candidate the set holds (M <= HELD). Otherwise (more
   than HELD candidates within the bounds: duplicates, integer grids; fewer than K valid candidates;
   a NaN or +inf key or bound, from NaN/Inf inputs or norms that overflow) its flag in `redo` is
   set, and the rerun kernel, select.py's IEEE kernel on the flagged rows alone, writes it. No read
   back to the host: the two launches are graph-capturable.

Under Triton's interpreter tl.dot ignores input_precision. INJECT (a test mode, never compiled for a
launch) scores in IEEE float32 instead (the IEEE kernel's products, on a GPU too) and adds to each
score an error of up to the bound, of either sign, placed adversarially; bound_scale inflates the
bound (an inflated bound is still a bound): the selection must equal the IEEE kernel's whatever the
errors (python/tests/test_bounded_select.py).

dot and scaled_dot only; cosine, gaussian, chebyshev and l1 stay on select.py's kernel.
"""
import triton
import triton.language as tl

from . import bitonic, row_chunks, select
from .similarities import CODES, DOT, SCALED_DOT

# The similarities this kernel serves (codes); the others stay on select.py's kernel.
SIMILARITIES = (CODES["dot"], CODES["scaled_dot"])

# Query rows per program and candidates per score tile: a [32, 64] tile of tensor-core products per
# FEATURES features, 8 warps. ptxas (sm_90, float32 tf32x3 at K <= 8): 32 features and 4 warps took
# 255 registers and spilled 128 bytes; 16 features and 8 warps, 196 and none. Without maxnreg ptxas
# held the half-precision kernels without a mask at K <= 32 to 128 registers and spilled 16-40 bytes
# (sm_80, sm_90); with it, 160 and none. Masks take 230-255 (scripts/triton_compile_check.py checks
# every specialisation for spills).
ROWS = 32
CANDIDATES = 64
FEATURES = 16
COMPILE_OPTIONS = {"num_warps": 8, "maxnreg": 255}
# The C++ launcher (src/ops/cuda/triton/select_launches.cpp) takes this kernel only where asked
# (CONVNN_SELECT_SCORES=tensor_cores): the static cost report estimates it slower than the IEEE kernel
# today (its running set's rounds and per-tile work on CUDA cores outweigh the scores it saves,
# BENCHMARKS.md), and no GPU has timed it yet (scripts/gpu_bench.py --tensor-cores).
# The widest features the error bound holds for (error_bound: 3 * D * 2^-22 < 1/2 with room).
MAX_FEATURES = 2 ** 18
# The tensor-core product of float32 inputs: "tf32x3", three TF32 products of split inputs, whose
# bound at D = 64 is about 2^-14 of |q||k| where plain "tf32"'s is 2^-9, at three times the tensor-core
# work. Measured under the interpreter with errors scattered up to the bound (32 rows, D = 64, K = 8
# and 64, test_rows_left_to_the_rerun_choose_the_float32_precision): on Gaussian inputs (M up to
# 16384) both settle every row; on keys and queries in tight clusters (noise 1% of the scale) TF32
# leaves every row to the rerun, tf32x3 none (at 0.1%: 2-9 of 32).
FLOAT32_PRECISION = "tf32x3"
# Test modes of the injected score errors (INJECT): none (every launch), a pseudo-random fraction of
# the bound of either sign, plus the bound on even candidates and minus on odd ones or the reverse,
# and a slope from minus the bound at candidate 0 to plus at the last or the reverse (the lower
# index, which wins exact ties, pushed below its equals or above them).
INJECTIONS = {"none": 0, "scattered": 1, "even up": 2, "odd up": 3, "later up": 4, "earlier up": 5}


def held_for(slots):
    """Upper bounds held per row at this width of the top-K: twice the slots, at least 16."""
    return max(16, 2 * slots)


# The error model (docs/operator.md, "Scores on tensor cores"): float32's unit roundoff; each
# accumulation step of a tensor core's float32 sum, relative to the magnitudes summed, assumed at
# most 4 units (twice truncation's: multi-term adders align a group's products to its largest
# exponent); the subnormal range, where products and sums may be flushed.
_UNIT = tl.constexpr(2.0 ** -24)
_TENSOR_CORE_STEP = tl.constexpr(2.0 ** -22)
_FLUSHED = tl.constexpr(2.0 ** -124)
# Norms are raised to at least this, so that terms proportional to one norm (flushed subnormal
# inputs) are bounded by a multiple of the product of the norms.
NORM_FLOOR = tl.constexpr(2.0 ** -60)


@triton.jit
def _gamma(terms, step):
    """Higham's gamma: the relative error bound terms * step / (1 - terms * step) of a sum of `terms`
    products with a relative error of at most `step` per step (float32 [...], terms * step < 1/2)."""
    return terms * step / (1.0 - terms * step)


@triton.jit
def error_bound(d, EXACT_PRODUCTS: tl.constexpr, PRECISION: tl.constexpr):
    """(model, slack, absolute), float32 scalars: with a row's and a candidate's norms nq and nk as
    _norms gives them, |s - s_ieee| <= model * nq * nk + absolute for the tensor-core score s of the
    pair and the IEEE kernel's s_ieee; slack * nq * nk more covers the roundings of adding the bound
    to s in float32. EXACT_PRODUCTS: bfloat16 or float16 inputs, whose products a tensor core forms
    exactly; else float32 through PRECISION ("tf32": inputs truncated to 10 bits; "tf32x3": split in
    two TF32 parts, three products). d < 2^19."""
    features = d.to(tl.float32)
    if EXACT_PRODUCTS:
        rounding = 0.0        # of a product
        magnitude = 1.0       # of a product's terms, relative to |q_f k_f|
        terms = features
    elif PRECISION == "tf32":
        rounding = 2.0 ** -9 + 2.0 ** -20  # (1 + 2^-10)^2 - 1
        magnitude = 1.0 + 2.0 ** -8
        terms = features
    else:
        tl.static_assert(PRECISION == "tf32x3")
        rounding = 2.0 ** -18  # the dropped low product and the low parts' truncation, 3 * 2^-20 and more
        magnitude = 1.0 + 2.0 ** -8
        terms = 3.0 * features
    tensor_core = _gamma(terms, _TENSOR_CORE_STEP)
    ieee = _gamma(features, _UNIT)   # the IEEE kernel's own FMA chain
    norms = _gamma(features + 2.0, _UNIT)  # each norm's sum of squares and square root
    model = (rounding + tensor_core * magnitude + ieee) / ((1.0 - norms) * (1.0 - norms))
    model = (model + features * 2.0 ** -60) * (1.0 + 2.0 ** -16)  # flushed inputs; this evaluation's roundings
    return model, 2.0 ** -21, terms * _FLUSHED


@triton.jit
def _norms(squares):
    """Euclidean norms from float32 sums of squares, correctly rounded, at least NORM_FLOOR."""
    return tl.maximum(tl.sqrt_rn(squares), NORM_FLOOR)


@triton.jit
def _tensor_core_dot(q, k, acc, PRECISION: tl.constexpr):
    """acc + q @ k^T on tensor cores: half precision as it is, float32 through PRECISION."""
    if q.dtype == tl.float32:
        acc = tl.dot(q, tl.trans(k), acc, input_precision=PRECISION)
    else:
        acc = tl.dot(q, tl.trans(k), acc)
    return acc


@triton.jit
def _injected(rows, cand, m, INJECT: tl.constexpr):
    """The test mode's error, a fraction of the bound in [-1, 1] per pair (INJECTIONS)."""
    even = (cand % 2 == 0)[None, :]
    slope = (2.0 * cand.to(tl.float32) / tl.maximum(m - 1, 1).to(tl.float32) - 1.0)[None, :]
    if INJECT == 1:
        fraction = ((rows[:, None] * 37 + cand[None, :] * 101) % 17).to(tl.float32) / 8.0 - 1.0
    elif INJECT == 2:
        fraction = tl.where(even, 1.0, -1.0) + tl.zeros([rows.shape[0], 1], tl.float32)
    elif INJECT == 3:
        fraction = tl.where(even, -1.0, 1.0) + tl.zeros([rows.shape[0], 1], tl.float32)
    elif INJECT == 4:
        fraction = slope + tl.zeros([rows.shape[0], 1], tl.float32)
    else:
        tl.static_assert(INJECT == 5)
        fraction = -slope + tl.zeros([rows.shape[0], 1], tl.float32)
    return fraction


@triton.jit
def _upper_bounds(q_ptr, k_ptr, q_rows, row_ok, cand, cand_ok, m, d, q_stride, k_stride, q_norms, model, slack,
                  absolute, ROWS: tl.constexpr, CANDIDATES: tl.constexpr, FEATURES: tl.constexpr,
                  PRECISION: tl.constexpr, INJECT: tl.constexpr, WHOLE_CHUNKS: tl.constexpr):
    """[ROWS, CANDIDATES] float32 upper bounds of the IEEE kernel's dot products of the tile's pairs:
    the tensor-core product plus its bound (the candidates' norms from the same loads). WHOLE_CHUNKS
    (select._whole_chunks holds): unmasked vector loads, the rows and candidates past their extents
    reading row 0 (their bounds are never kept), as select._dot_keys."""
    approx = tl.zeros([ROWS, CANDIDATES], dtype=tl.float32)
    squares = tl.zeros([CANDIDATES], dtype=tl.float32)
    q_starts = tl.where(row_ok, q_rows, 0).to(tl.int64) * q_stride
    k_starts = tl.where(cand_ok, cand, 0).to(tl.int64) * k_stride
    first = 0
    while first < d:
        features = first + tl.arange(0, FEATURES)
        if WHOLE_CHUNKS:
            q = tl.load(tl.multiple_of(q_ptr + q_starts[:, None] + features[None, :], [FEATURES, FEATURES]))
            k = tl.load(tl.multiple_of(k_ptr + k_starts[:, None] + features[None, :], [FEATURES, FEATURES]))
        else:
            feature_ok = features < d
            q = tl.load(q_ptr + q_starts[:, None] + features[None, :], mask=row_ok[:, None] & feature_ok[None, :],
                        other=0.0)
            k = tl.load(k_ptr + k_starts[:, None] + features[None, :], mask=cand_ok[:, None] & feature_ok[None, :],
                        other=0.0)
        if INJECT == 0:
            approx = _tensor_core_dot(q, k, approx, PRECISION)
        else:  # the IEEE kernel's products, so that the injected error is the whole error, on a GPU too
            approx = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), approx, input_precision="ieee")
        k32 = k.to(tl.float32)
        squares += tl.sum(k32 * k32, 1)
        first += FEATURES
    products = q_norms[:, None] * _norms(squares)[None, :]
    if INJECT != 0:
        approx += _injected(q_rows, cand, m, INJECT) * (model * products + absolute)
    return approx + ((model + slack) * products + absolute)


@triton.jit
def _exact_dots(q_ptr, k_ptr, q_rows, row_ok, held, held_ok, d, q_stride, k_stride, ROWS: tl.constexpr,
                HELD: tl.constexpr):
    """[ROWS, HELD] float32 dot products of each row with its held candidates, as select._dot_keys
    computes them on a GPU: tl.dot(input_precision="ieee") lowers to one FMA per feature, in feature
    order, from +0 (Triton's FMA dot: acc = fma(a_k, b_k, acc)); the padding features past D that
    it adds are (+0) * (+0), which leave every such sum as it is."""
    dots = tl.zeros([ROWS, HELD], dtype=tl.float32)
    feature = 0
    while feature < d:
        q = tl.load(q_ptr + q_rows.to(tl.int64) * q_stride + feature, mask=row_ok, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + held.to(tl.int64) * k_stride + feature, mask=held_ok, other=0.0).to(tl.float32)
        dots = tl.fma(q[:, None], k, dots)
        feature += 1
    return dots


@triton.jit
def _bounded_select_kernel(q_ptr, k_ptr, mask_ptr, scores_ptr, indices_ptr, redo_ptr, n, m, d, k, mask_slice_stride,
                           similarity_constant, bound_scale, dtype_code, heads, q_batch_stride, q_head_stride,
                           q_row_stride, k_batch_stride, k_head_stride, k_row_stride, SIMILARITY: tl.constexpr,
                           MASK: tl.constexpr, ROWS: tl.constexpr, CANDIDATES: tl.constexpr, SLOTS: tl.constexpr,
                           HELD: tl.constexpr, FEATURES: tl.constexpr, PRECISION: tl.constexpr,
                           INJECT: tl.constexpr = 0):
    # The settled rows' scores and indices are written as select._select_kernel writes them (slots
    # by descending key, contiguous [G, N, K], the scores in the op's dtype); redo [G * N] int32
    # gets 1 for the rows left to the rerun, 0 for the others. bound_scale: 1 on every launch.
    tl.static_assert((SIMILARITY == DOT) | (SIMILARITY == SCALED_DOT))
    tl.static_assert(HELD >= SLOTS)
    block = tl.program_id(0)
    g = tl.program_id(1).to(tl.int64)
    rows = block * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n
    q_ptr += row_chunks.slice_starts(g, heads, q_batch_stride, q_head_stride)
    k_ptr += row_chunks.slice_starts(g, heads, k_batch_stride, k_head_stride)
    mask_rows = mask_ptr + g * mask_slice_stride + rows.to(tl.int64)[:, None] * m  # unread without a mask
    model, slack, absolute = error_bound(d, q_ptr.dtype.element_ty != tl.float32, PRECISION)
    model, slack, absolute = model * bound_scale, slack * bound_scale, absolute * bound_scale

    # 1. The HELD largest upper bounds of each row, packed with their indices; empty slots hold -inf
    # with indices m + 1, m + 2, ... (below every candidate, a masked one included).
    squares = tl.zeros([ROWS], dtype=tl.float32)
    first = 0
    while first < d:
        features = first + tl.arange(0, FEATURES)
        x = tl.load(q_ptr + rows.to(tl.int64)[:, None] * q_row_stride + features[None, :],
                    mask=row_ok[:, None] & (features < d)[None, :], other=0.0).to(tl.float32)
        squares += tl.sum(x * x, 1)
        first += FEATURES
    q_norms = _norms(squares)
    slots = tl.arange(0, HELD)
    top = select._packed(tl.full([ROWS, HELD], float("-inf"), tl.float32),
                         m + 1 + slots[None, :] + tl.zeros([ROWS, HELD], tl.int32))
    threshold = tl.min(top, 1)
    least = tl.full([ROWS], float("-inf"), tl.float32)  # the set's least upper bound, as a float
    unsettled = tl.zeros([ROWS], dtype=tl.int32)
    whole_chunks = select._whole_chunks(q_ptr, k_ptr, d, q_row_stride, k_row_stride, FEATURES)
    first = 0
    while first < m:
        cand = first + tl.arange(0, CANDIDATES)
        cand_ok = cand < m
        if whole_chunks:
            upper = _upper_bounds(q_ptr, k_ptr, rows, row_ok, cand, cand_ok, m, d, q_row_stride, k_row_stride,
                                  q_norms, model, slack, absolute, ROWS, CANDIDATES, FEATURES, PRECISION, INJECT, True)
        else:
            upper = _upper_bounds(q_ptr, k_ptr, rows, row_ok, cand, cand_ok, m, d, q_row_stride, k_row_stride,
                                  q_norms, model, slack, absolute, ROWS, CANDIDATES, FEATURES, PRECISION, INJECT, False)
        both_ok = row_ok[:, None] & cand_ok[None, :]
        # Through the similarity's key and the mask, as the IEEE kernel's scores: each keeps order.
        upper = select._masked(select.scaled_by_root(upper, similarity_constant, SIMILARITY),
                               mask_rows + cand[None, :], both_ok, MASK)
        # The float gate: a tile none of whose pairs reaches its row's least held bound (and none NaN;
        # +inf reaches any) would let no packed key in, whatever the indices, so it skips the packing,
        # the rounds and the NaN and +inf rule: once the sets settle, most tiles at long N.
        reaching = both_ok & ((upper >= least[:, None]) | (upper != upper))
        if tl.max(tl.max(reaching.to(tl.int32), 1), 0) != 0:
            unsettled |= tl.max(select._unrankable(upper, both_ok), 1)
            packed = tl.where(both_ok, select._packed(upper, cand[None, :] + tl.zeros([ROWS, CANDIDATES], tl.int32)),
                              select.LEAST_KEY)
            top, threshold = select.entered(top, threshold, packed, HELD)
            least, _ = select._unpacked(threshold)
        first += CANDIDATES

    # 2. The held candidates' exact keys, ranked by the exact packed keys.
    _, held = select._unpacked(top)
    held_ok = row_ok[:, None] & (held < m)
    exact = select._masked(select.scaled_by_root(_exact_dots(q_ptr, k_ptr, rows, row_ok, held, held_ok, d,
                                                             q_row_stride, k_row_stride, ROWS, HELD),
                                                 similarity_constant, SIMILARITY),
                           mask_rows + held, held_ok, MASK)
    unsettled |= tl.max(select._unrankable(exact, held_ok), 1)
    best = bitonic.largest(tl.where(held_ok, select._packed(exact, held), select.LEAST_KEY), SLOTS, 1)
    in_k = tl.arange(0, SLOTS)[None, :] < k
    kth_key, _ = select._unpacked(tl.min(tl.where(in_k, best, select.GREATEST_KEY), 1))
    u_min, _ = select._unpacked(threshold)

    # 3. Settled: nothing outside the set can reach the K-th key, or the set holds every candidate.
    settled = ((u_min < kth_key) | (m <= HELD)) & (unsettled == 0)
    best_keys, best_index = select._unpacked(best)
    out = (g * n + rows)[:, None] * k + tl.arange(0, SLOTS)[None, :]
    written = (row_ok & settled)[:, None] & in_k
    # The indices before the scores: stored after store_as's branches, Triton 3.6 reused a layout
    # conversion of `written` made inside one of them ("operand does not dominate this use", sm_90).
    tl.store(indices_ptr + out, best_index.to(tl.int64), mask=written)
    tl.store(redo_ptr + g * n + rows, tl.where(settled, 0, 1), mask=row_ok)
    select.store_as(scores_ptr, out, best_keys, written, dtype_code)


@triton.jit
def _rerun_kernel(q_ptr, k_ptr, mask_ptr, scores_ptr, indices_ptr, redo_ptr, n, m, d, k, mask_slice_stride,
                  similarity_constant, dtype_code, heads, q_batch_stride, q_head_stride, q_row_stride, k_batch_stride,
                  k_head_stride, k_row_stride, SIMILARITY: tl.constexpr, MASK: tl.constexpr, ROWS: tl.constexpr,
                  CANDIDATES: tl.constexpr, SLOTS: tl.constexpr, FEATURES: tl.constexpr,
                  SHARED_SET: tl.constexpr = False):
    # select._select_kernel on the rows whose redo flag is set; a program with none returns at once.
    block = tl.program_id(0)
    g = tl.program_id(1).to(tl.int64)
    rows = block * ROWS + tl.arange(0, ROWS)
    flagged = tl.load(redo_ptr + g * n + rows, mask=rows < n, other=0) != 0
    if tl.max(flagged.to(tl.int32), 0) != 0:
        select.select_rows(q_ptr, k_ptr, mask_ptr, scores_ptr, indices_ptr, g, rows, flagged, n, m, d, k,
                           mask_slice_stride, similarity_constant, dtype_code, heads, q_batch_stride, q_head_stride,
                           q_row_stride, k_batch_stride, k_head_stride, k_row_stride, SIMILARITY, MASK, ROWS,
                           CANDIDATES, SLOTS, FEATURES, SHARED_SET)
