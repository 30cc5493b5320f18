"""Fused GPU kernel of knn_select, in Triton (issue 25 §1): per program, one slice and a block of
query rows; score tiles against blocks of candidates feed a running top-K held on chip, so the
[G,N,M] score matrix is never written to memory.

The selection rule is docs/operator.md's, the one every path follows:
- candidates rank by their key (larger is more similar), the lower candidate index winning ties;
  masked candidates (a false bool entry, or a -inf key) rank last, lower index first, and fill the
  slots of rows with fewer than K valid candidates;
- slots by descending key, or with index_order by ascending index;
- dot, scaled_dot and cosine rank by the score; gaussian, chebyshev and l1 by minus the distance,
  from exact pairwise differences, and report exp(key).
The similarities' arithmetic is restated here (a Triton kernel cannot call the C++ policies of
src/ops/kernels/similarity.h); the tests hold the two to the same indices on inputs whose scores
are exact (integer-valued), and to rounding elsewhere.

As in aggregate.py: each output element is written by one program, no atomics; every load and
store is masked to its tensor's extent; loops over runtime bounds are `while` loops (the
interpreter's numpy 2.4 issue); the scores that rank candidates come from `tl.dot` with
input_precision="ieee" (a GPU's float32 default is TF32, which would rank by other scores than
the ones the tests verify) and divisions by tl.math.div_rn (IEEE, as the CPU's).
"""
import torch
import triton
import triton.language as tl

from . import bitonic
from .similarities import CHEBYSHEV, CODES, COSINE, GAUSSIAN, L1, SCALED_DOT, is_distance, is_dot_product

# Query rows per program: with 32, ptxas (sm_90, 4 warps) used all 255 registers and spilled at
# some widths of the running top-K; with 16, 150-235 registers and no spill at any width.
ROWS = 16
CANDIDATES = 64    # candidates per score tile (candidates_for: 32 with a mask)
MAX_SLOTS = 64     # the largest K the kernel holds on chip; a larger K takes the generic path
# A tile that some row of the block enters more than ROUNDS times is merged by a bitonic network
# (_running_top_k): on sm_90 one merge costs about as many instructions as 4.7 rounds
# (scripts/triton_cost_report.py: 654 and 139 SASS instructions per warp at K <= 8). The network
# serves K <= BITONIC_SLOTS: at 16 slots and more it spilled registers beside a mask.
ROUNDS = 4
BITONIC_SLOTS = 8


# Launch options: 8 warps, and at most 128 registers per thread. Without the cap, ptxas chose 64 or
# 80 registers for some specialisations and spilled 8-20 bytes (sm_80 and sm_90); with it, none
# spills (scripts/triton_compile_check.py) and two blocks fit an SM.
COMPILE_OPTIONS = {"num_warps": 8, "maxnreg": 128}


# Widths of the running top-K: 8, 16, 32, 64. A K below 8 holds 8 slots (a few registers more; the
# rounds are at most K either way): four compiled widths per similarity and dtype instead of six.
MIN_SLOTS = 8


def slots_for(k):
    return max(MIN_SLOTS, triton.next_power_of_2(k))


def candidates_for(k, mask_kind):
    """Candidates per score tile: 64 without a mask, 32 with one. With a mask at 64, its loads
    beside the running top-K spilled 8-60 bytes (ptxas, sm_80 and sm_90: the bitonic network at
    K <= 8, the rounds' state at 16 slots and more); at 32, 94-108 registers and no spill. Without
    a mask, 64 costs fewer instructions per score than 32 (scripts/triton_cost_report.py)."""
    return CANDIDATES if mask_kind == NO_MASK else CANDIDATES // 2


def features_for(d):
    """Features per tl.dot chunk of the dot products: 16, the least tl.dot takes (with 32, ptxas
    spilled at some widths of the running top-K on sm_80 and sm_90)."""
    return 16


SIMILARITY_CODES = CODES  # the similarities' compile-time codes (similarities.py)
NO_MASK, BOOL_MASK, ADDITIVE_MASK = 0, 1, 2
# The op's dtype, a runtime argument of the kernels that write their outputs in it (issue 38 §1: no
# float32 copy to round afterwards). The pointers' compiled type stays float32; a half-precision
# output is written through a pointer of its own type.
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
BFLOAT16_CODE, FLOAT16_CODE = tl.constexpr(DTYPE_CODES[torch.bfloat16]), tl.constexpr(DTYPE_CODES[torch.float16])


@triton.jit
def store_as(ptr, offsets, x, mask, dtype_code):
    """Stores float32 x at ptr + offsets in the dtype that dtype_code names, rounded to nearest even."""
    if dtype_code == BFLOAT16_CODE:
        tl.store(ptr.to(tl.pointer_type(tl.bfloat16)) + offsets, x.to(tl.bfloat16), mask=mask)
    elif dtype_code == FLOAT16_CODE:
        tl.store(ptr.to(tl.pointer_type(tl.float16)) + offsets, x.to(tl.float16), mask=mask)
    else:
        tl.store(ptr + offsets, x, mask=mask)


@triton.jit
def _pair_keys(q_ptr, k_ptr, q_rows, row_ok, cand, cand_ok, d, similarity_constant,
               SIMILARITY: tl.constexpr, ROWS: tl.constexpr, CANDIDATES: tl.constexpr, FEATURES: tl.constexpr):
    """[ROWS, CANDIDATES] ranking keys, in float32. similarity_constant: sqrt(D) rounded to float32
    for scaled_dot, the epsilon (kCosineEps in float32) for cosine, unread otherwise."""
    # Dot products as tl.dot tiles in IEEE float32, FEATURES features at a time; the distances
    # (exact pairwise differences) one feature at a time. Register use measured with ptxas -v
    # (sm_80, sm_90): 32 query rows and a tile of all 64 features spilled kilobytes; 16 rows,
    # 8 warps and 16-feature chunks, none (scripts/triton_compile_check.py fails on a spill).
    keys = tl.zeros([ROWS, CANDIDATES], dtype=tl.float32)
    if is_dot_product(SIMILARITY):  # tl.dot over chunks of FEATURES features
        # Cosine's squared norms ride along (the rows are raw: see below).
        q_squares = tl.zeros([ROWS], dtype=tl.float32)
        k_squares = tl.zeros([CANDIDATES], dtype=tl.float32)
        first = 0
        while first < d:
            features = first + tl.arange(0, FEATURES)
            feature_ok = features < d
            q = tl.load(q_ptr + q_rows.to(tl.int64)[:, None] * d + features[None, :],
                        mask=row_ok[:, None] & feature_ok[None, :], other=0.0).to(tl.float32)
            k = tl.load(k_ptr + cand.to(tl.int64)[:, None] * d + features[None, :],
                        mask=cand_ok[:, None] & feature_ok[None, :], other=0.0).to(tl.float32)
            keys = tl.dot(q, tl.trans(k), keys, input_precision="ieee")
            if SIMILARITY == COSINE:
                q_squares += tl.sum(q * q, 1)
                k_squares += tl.sum(k * k, 1)
            first += FEATURES
        if SIMILARITY == COSINE:
            # (q.k * (1/max(|q|,eps))) * (1/max(|k|,eps)) from the raw rows, in that order, as on
            # every path (src/ops/kernels/similarity.h): exactly orthogonal rows score exactly 0.
            eps = tl.full([], similarity_constant, tl.float32)
            q_factors = tl.math.div_rn(tl.full([ROWS], 1.0, tl.float32), tl.maximum(tl.sqrt_rn(q_squares), eps))
            k_factors = tl.math.div_rn(tl.full([CANDIDATES], 1.0, tl.float32), tl.maximum(tl.sqrt_rn(k_squares), eps))
            keys = keys * q_factors[:, None] * k_factors[None, :]
        if SIMILARITY == SCALED_DOT:
            root = similarity_constant
            # x / root correctly rounded. With root a power of two (D = 4, 16, 64, 256, ...) its
            # reciprocal is exact, so x * (1 / root) is the same correctly rounded quotient, at one
            # multiply instead of an IEEE division's dozen instructions.
            if (tl.full([], root, tl.float32).to(tl.int32, bitcast=True) & 0x7FFFFF) == 0:
                keys = keys * tl.math.div_rn(1.0, root)
            else:
                keys = tl.math.div_rn(keys, tl.full([ROWS, CANDIDATES], root, tl.float32))
    else:  # the distances: minus the distance, from exact pairwise differences, a feature at a time
        tl.static_assert(is_distance(SIMILARITY))
        j = 0
        while j < d:
            qj = tl.load(q_ptr + q_rows.to(tl.int64) * d + j, mask=row_ok, other=0.0).to(tl.float32)
            kj = tl.load(k_ptr + cand.to(tl.int64) * d + j, mask=cand_ok, other=0.0).to(tl.float32)
            diff = qj[:, None] - kj[None, :]
            if SIMILARITY == GAUSSIAN:
                keys += diff * diff
            elif SIMILARITY == CHEBYSHEV:
                keys = tl.maximum(keys, tl.abs(diff))
            else:
                tl.static_assert(SIMILARITY == L1)
                keys += tl.abs(diff)
            j += 1
        keys = -keys
    return keys


# Packed ranking keys (the running top-K's currency): a float32 key and its candidate index in one
# int64, so that one integer comparison applies the whole ranking rule. The upper half is the key's
# bits mapped to a signed integer of the same order (negative floats have their magnitude bits
# flipped), after -0 is made +0 (the two tie); the lower half is the index's complement in 32 bits
# (2^32 - 1 - index), so an exact tie goes to the lower index. -inf (masked) packs below every
# finite key; a candidate past the slice packs as the least int64, below every real candidate; NaN
# and +inf keys flag their row (unrankable) whatever they pack to.
LEAST_KEY = tl.constexpr(-(2**63))
GREATEST_KEY = tl.constexpr(2**63 - 1)
INDEX_BITS = tl.constexpr(2**32 - 1)


@triton.jit
def _packed(keys, cand):
    """int64 ranking keys of float32 keys [ROWS, CANDIDATES] and their candidate indices."""
    bits = tl.where(keys == 0.0, 0.0, keys).to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return (ordered.to(tl.int64) << 32) | (cand.to(tl.int64) ^ INDEX_BITS)


@triton.jit
def _unpacked(packed):
    """(float32 keys, int32 indices) of packed ranking keys: the inverse of _packed."""
    ordered = (packed >> 32).to(tl.int32)
    bits = tl.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered)
    return bits.to(tl.float32, bitcast=True), ((packed & INDEX_BITS) ^ INDEX_BITS).to(tl.int32)


@triton.jit
def _running_top_k(q_ptr, k_ptr, mask_ptr, g, rows, row_ok, n, m, d, k, mask_slice_stride, similarity_constant,
                   SIMILARITY: tl.constexpr, MASK: tl.constexpr, ROWS: tl.constexpr, CANDIDATES: tl.constexpr,
                   SLOTS: tl.constexpr, FEATURES: tl.constexpr, ROUNDS: tl.constexpr = ROUNDS,
                   BITONIC_SLOTS: tl.constexpr = BITONIC_SLOTS):
    """The K best candidates of each of the ROWS query rows of slice g, best first: (keys [ROWS,
    SLOTS] float32, indices [ROWS, SLOTS] int32, unrankable [ROWS]: rows that met a NaN or +inf key).
    Shared by the select kernel and the fused attention kernel (attention.py).

    Selection without merge rounds (issue 38): each row keeps its K best packed keys as an unordered
    set and their least, the threshold. A tile's keys are gated against the threshold; the ones
    that pass enter one per row per round, each replacing the set's least (the keys are distinct,
    so exactly one slot holds it), for as many rounds as the block's busiest row has entries (at
    most K: after K no key left in the tile beats the set), so none once the thresholds settle. At
    K <= BITONIC_SLOTS a tile with more than ROUNDS entries in some row (the first tiles) is merged
    by bitonic networks instead (bitonic.py). One sort of the K slots at the end puts them best
    first."""
    q_rows = g * n + rows
    slots = tl.arange(0, SLOTS)
    in_k = slots[None, :] < k
    # Empty slots: -inf keys of indices m+1, m+2, ... (distinct, and below every real candidate:
    # k <= m, so the set fills with real ones); slots past K hold the greatest key, never the least.
    empty = _packed(tl.full([ROWS, SLOTS], float("-inf"), tl.float32),
                    m + 1 + slots[None, :] + tl.zeros([ROWS, SLOTS], tl.int32))
    top = tl.where(in_k, empty, GREATEST_KEY)
    threshold = tl.min(top, 1)
    # Rows that met a NaN or +inf key cannot be ranked: their scores come out NaN, as the generic
    # path's where values are not read (docs/operator.md, "NaN and Inf rule").
    unrankable = tl.zeros([ROWS], dtype=tl.int32)
    first = 0
    while first < m:
        cand = first + tl.arange(0, CANDIDATES)
        cand_ok = cand < m
        keys = _pair_keys(q_ptr, k_ptr, q_rows, row_ok, g * m + cand, cand_ok, d, similarity_constant,
                          SIMILARITY, ROWS, CANDIDATES, FEATURES)
        both_ok = row_ok[:, None] & cand_ok[None, :]
        if MASK == 1:
            allowed = tl.load(mask_ptr + g * mask_slice_stride + rows.to(tl.int64)[:, None] * m + cand[None, :],
                              mask=both_ok, other=0)
            keys = tl.where(allowed != 0, keys, float("-inf"))
        elif MASK == 2:
            keys += tl.load(mask_ptr + g * mask_slice_stride + rows.to(tl.int64)[:, None] * m + cand[None, :],
                            mask=both_ok, other=0.0).to(tl.float32)
        unrankable |= tl.max((both_ok & ((keys != keys) | (keys == float("inf")))).to(tl.int32), 1)
        packed = tl.where(both_ok, _packed(keys, cand[None, :] + tl.zeros([ROWS, CANDIDATES], tl.int32)),
                          LEAST_KEY)
        # The gate: only keys above their row's threshold can enter.
        passing = tl.where(packed > threshold[:, None], packed, LEAST_KEY)
        # Rounds for the busiest row, at most K.
        entries = tl.minimum(tl.max(tl.sum((passing != LEAST_KEY).to(tl.int32), 1), 0), k)
        if SLOTS <= BITONIC_SLOTS:  # a compile-time choice: the network at K <= 8 only
            if entries > ROUNDS:
                # Many entries (the first tiles): the tile's best SLOTS by a bitonic network, merged
                # into the set (sorted for it) by one bitonic merge (bitonic.py).
                best = bitonic.largest(passing, SLOTS, 0)
                top = bitonic.largest(tl.where(in_k, top, LEAST_KEY), SLOTS, 1)
                top = bitonic.merge_sorted(top, best)
                top = tl.where(in_k, top, GREATEST_KEY)
                threshold = tl.min(top, 1)
                entries = 0
        # Few: one round per entry of the busiest row, each entry replacing its set's least.
        entry = 0
        while entry < entries:
            best = tl.max(passing, 1)
            enters = best > threshold
            top = tl.where(enters[:, None] & (top == threshold[:, None]), best[:, None], top)
            passing = tl.where(passing == best[:, None], LEAST_KEY, passing)
            threshold = tl.min(top, 1)
            entry += 1
        first += CANDIDATES
    top = bitonic.largest(tl.where(in_k, top, LEAST_KEY), SLOTS, 1)
    top_keys, top_index = _unpacked(top)
    return tl.where(in_k, top_keys, float("-inf")), tl.where(in_k, top_index, m), unrankable


@triton.jit
def _reported_scores(top_keys, unrankable, SIMILARITY: tl.constexpr):
    """The scores the op reports for ranking keys: exp(key) for the distances (exp(-distance); a
    masked slot reports -inf on every path), NaN in unrankable rows."""
    scores = top_keys
    if is_distance(SIMILARITY):
        scores = tl.where(top_keys == float("-inf"), float("-inf"), tl.exp(top_keys))
    return tl.where(unrankable[:, None] != 0, float("nan"), scores)


@triton.jit
def _select_kernel(q_ptr, k_ptr, mask_ptr, scores_ptr, indices_ptr, n, m, d, k, mask_slice_stride, similarity_constant,
                   dtype_code, SIMILARITY: tl.constexpr, MASK: tl.constexpr, ROWS: tl.constexpr,
                   CANDIDATES: tl.constexpr, SLOTS: tl.constexpr, FEATURES: tl.constexpr):
    # Slots by descending key (the launcher reorders them by index where asked). Queries, keys and
    # an additive mask are float32 (the launcher converts), the scores written in the op's dtype
    # (dtype_code): one compiled kernel per similarity, slot width and mask kind serves every dtype
    # and order, which keeps the images the C++ library embeds few (scripts/triton_aot.py). Reading
    # half-precision queries and keys in the kernel instead (a predicated load per dtype) doubled the
    # SASS of the score tiles' loop (108 -> 203 per 16 features, sm_90), and a branch per dtype
    # around such loads failed to compile in the fused attention kernel (Triton 3.6): the
    # conversion stays a launcher pass.
    # The mask kind stays a compile-time
    # choice: as a runtime one, ptxas spilled 8-24 bytes at K <= 16 and 64 (sm_80 and sm_90), and
    # so did a runtime index-order pass in the kernel (16 bytes, the distances at K <= 16, sm_80).
    block = tl.program_id(0)
    g = tl.program_id(1).to(tl.int64)
    rows = block * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n
    top_keys, top_index, unrankable = _running_top_k(q_ptr, k_ptr, mask_ptr, g, rows, row_ok, n, m, d, k,
                                                     mask_slice_stride, similarity_constant, SIMILARITY, MASK, ROWS, CANDIDATES,
                                                     SLOTS, FEATURES)
    scores = _reported_scores(top_keys, unrankable, SIMILARITY)
    slots = tl.arange(0, SLOTS)
    out = (g * n + rows)[:, None] * k + slots[None, :]
    written = row_ok[:, None] & (slots[None, :] < k)
    store_as(scores_ptr, out, scores, written, dtype_code)
    tl.store(indices_ptr + out, top_index.to(tl.int64), mask=written)
