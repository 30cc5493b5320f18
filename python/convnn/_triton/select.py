"""Fused GPU kernel of knn_select, in Triton (issue 25 §1): per program, one slice and a block of
query rows; score tiles against blocks of candidates feed a running top-K held on chip, so the
[G,N,M] score matrix is never written to memory. At K <= THREAD_SLOTS (the layers' usual K) the
running top-K of a query row is held by one thread (_thread_top_k: one warp of 32 rows per
program); at larger K by the threads of a row together (_shared_top_k: 16 rows, 8 warps).

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

from . import bitonic, row_chunks
from .similarities import CHEBYSHEV, CODES, COSINE, GAUSSIAN, L1, SCALED_DOT, is_distance, is_dot_product

# Query rows per program of the set shared by a row's threads (K above THREAD_SLOTS), and of
# attention.py's softmax scores gradient: with 32, ptxas (sm_90, 4 warps) used all 255 registers and
# spilled at some widths of the running top-K; with 16, 150-235 registers and no spill.
ROWS = 16
CANDIDATES = 64    # candidates per score tile of the shared set (candidates_for: 32 with a mask)
MAX_SLOTS = 64     # the largest K the kernel holds on chip; a larger K takes the generic path


# Launch options of the shared set: 8 warps, and at most 128 registers per thread. Without the cap,
# ptxas chose 64 or 80 registers for some specialisations and spilled 8-20 bytes (sm_80 and sm_90);
# with it, none spills (scripts/triton_compile_check.py) and two blocks fit an SM.
COMPILE_OPTIONS = {"num_warps": 8, "maxnreg": 128}

# At K <= THREAD_SLOTS the running top-K is held a query row per thread (_thread_top_k): one warp per
# program, a row per lane (THREAD_ROWS), THREAD_CANDIDATES candidates per score tile (the least
# tl.dot takes). Registers (ptxas, sm_80 and sm_90, every similarity and mask kind): 114-255 without
# a spill under THREAD_OPTIONS' cap; each thread's 4x4 block of the score tile reads 128 operands
# per 16 features. A cap of 168 spills 32-104 bytes (the dot products at K <= 8), and 255 spilled
# while masks were loaded as [rows, candidates] tiles (now a column at a time, in the row's
# thread). At 200-255 registers an SM holds 8 such warps (16 of the shared set's): the static cost
# report does not model occupancy; a GPU measurement decides between the two sets.
THREAD_SLOTS = 16
THREAD_ROWS = 32
THREAD_CANDIDATES = 16
THREAD_OPTIONS = {"num_warps": 1, "maxnreg": 255}
_THREAD_SLOTS = tl.constexpr(THREAD_SLOTS)  # for the kernels


def held_per_thread(slots):
    """Whether the running top-K of this width is held a query row per thread (_thread_top_k)."""
    return slots <= THREAD_SLOTS


def rows_for(slots):
    """Query rows per program of the kernels built on the running top-K at this width (design)."""
    return design(slots, NO_MASK)[0]["ROWS"]


# Widths of the running top-K: 8, 16, 32, 64. A K below 8 holds 8 slots (a few registers more; the
# rounds are at most K either way): four compiled widths per similarity and dtype instead of six.
MIN_SLOTS = 8


def slots_for(k):
    return max(MIN_SLOTS, triton.next_power_of_2(k))


def design(slots, mask_kind, shared_set=False):
    """How the running-top-K kernels launch at this width: {"ROWS", "CANDIDATES", "SHARED_SET"} (their
    constexprs beside the similarity, mask, slots and features) and the launch options. The launchers'
    choice (specialisations.py, the C++ top_k_rows), or with shared_set the set shared by a row's
    threads at any width, which no launcher asks for: scripts/gpu_bench.py times the two on one GPU."""
    per_thread = held_per_thread(slots) and not shared_set
    rows, options = (THREAD_ROWS, THREAD_OPTIONS) if per_thread else (ROWS, COMPILE_OPTIONS)
    return {"ROWS": rows, "CANDIDATES": candidates_for(slots, mask_kind, shared_set), "SHARED_SET": shared_set}, options


def candidates_for(k, mask_kind, shared_set=False):
    """Candidates per score tile. Held a row per thread: THREAD_CANDIDATES. Shared by a row's
    threads: 64 without a mask, 32 with one. With a mask at 64, its loads beside the running top-K
    spilled 8-60 bytes (ptxas, sm_80 and sm_90: the rounds' state at 16 slots and more); at 32,
    94-108 registers and no spill. Without a mask, 64 costs fewer instructions per score than 32
    (scripts/triton_cost_report.py)."""
    if held_per_thread(slots_for(k)) and not shared_set:
        return THREAD_CANDIDATES
    return CANDIDATES if mask_kind == NO_MASK else CANDIDATES // 2


def features_for(d):
    """Features per tl.dot chunk of the dot products: 16, the least tl.dot takes (with 32, ptxas
    spilled at some widths of the running top-K on sm_80 and sm_90)."""
    return 16


SIMILARITY_CODES = CODES  # the similarities' compile-time codes (similarities.py)
# The dtypes of the queries, keys (and the fused attention's values, kernel and bias) that the
# kernels built on the running top-K are compiled to read, a kernel per dtype: half precision is
# converted to float32 in registers (exactly; the scores rank in float32 either way), where the
# launcher made float32 copies before (issue 38 §1). Each dtype here is another 144 images to
# compile (specialisations.py); a dtype not here the launcher converts to float32.
INPUT_DTYPES = ("float32", "bfloat16", "float16")
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
def inverse_of_norms(squares, eps):
    """1 / max(sqrt(squares), eps) in IEEE float32 (cosine's factors, as src/ops/kernels/similarity.h)."""
    return tl.math.div_rn(tl.full(squares.shape, 1.0, tl.float32),
                          tl.maximum(tl.sqrt_rn(squares), tl.full([], eps, tl.float32)))


@triton.jit
def fma_chain(x, y, sums):
    """sums after fma(x_f, y_f, .) over the 8 features of x and y ([A, B, 8] or broadcasting to it, as
    sums [A, B]), in order."""
    x0, x1, x2, x3, x4, x5, x6, x7 = in_feature_order(x)
    y0, y1, y2, y3, y4, y5, y6, y7 = in_feature_order(y)
    sums = tl.fma(x0, y0, sums)
    sums = tl.fma(x1, y1, sums)
    sums = tl.fma(x2, y2, sums)
    sums = tl.fma(x3, y3, sums)
    sums = tl.fma(x4, y4, sums)
    sums = tl.fma(x5, y5, sums)
    sums = tl.fma(x6, y6, sums)
    return tl.fma(x7, y7, sums)


@triton.jit
def in_feature_order(x):
    """The 8 slices x[..., 0], ..., x[..., 7] of x [A, B, 8] ([A, B] each), in order: free in registers
    where a thread holds a row's 8 (a vector load's)."""
    A: tl.constexpr = x.shape[0]
    B: tl.constexpr = x.shape[1]
    even, odd = tl.split(tl.reshape(x, [A, B, 2, 2, 2]))  # feature 4a + 2b + c: c = 0, 1
    even_low, even_high = tl.split(even)                  # b = 0, 1
    odd_low, odd_high = tl.split(odd)
    f0, f4 = tl.split(even_low)                           # a = 0, 1
    f2, f6 = tl.split(even_high)
    f1, f5 = tl.split(odd_low)
    f3, f7 = tl.split(odd_high)
    return f0, f1, f2, f3, f4, f5, f6, f7


@triton.jit
def sums_of_squares(ptr, rows, row_ok, d, row_stride, R: tl.constexpr):
    """[R] float32 sums of squares of the rows `rows` of ptr (d features each, row_stride apart): an FMA
    chain in feature order from +0 (fma_chain, 8 features a load), the order of the CPU's sums
    (src/ops/kernels/similarity.h, detail::dot), whatever layout the compiler gives the loads (a
    tl.sum's tree would follow the layout, and bounded_select.py's re-rank must reproduce these bits
    in another kernel); 0 for rows not row_ok. Cosine's norms here and bounded_select.py's norms (and
    gaussian's squared norms) come from this one sum. (16 features a load, split in registers, spilled
    20 bytes in the set shared by a row's threads at K <= 64, half inputs, sm_90.)"""
    squares = tl.zeros([R, 1], dtype=tl.float32)
    first = 0
    while first < d:
        features = first + tl.arange(0, 8)
        x = tl.load(ptr + rows.to(tl.int64)[:, None] * row_stride + features[None, :],
                    mask=row_ok[:, None] & (features < d)[None, :], other=0.0).to(tl.float32)
        x = tl.reshape(x, [R, 1, 8])
        squares = fma_chain(x, x, squares)
        first += 8
    return tl.reshape(squares, [R])


@triton.jit
def _row_factors(ptr, rows, row_ok, d, row_stride, similarity_constant, SIMILARITY: tl.constexpr, R: tl.constexpr):
    """Cosine's inverse norms of R rows of ptr (d features each, row_stride apart) from
    sums_of_squares; zeros for the other similarities (unread). Apart from the dot products' loop,
    whose tiles it would keep live beside the ones tl.dot reads (ptxas spilled with a mask at K <= 8)."""
    factors = tl.zeros([R], dtype=tl.float32)
    if SIMILARITY == COSINE:
        factors = inverse_of_norms(sums_of_squares(ptr, rows, row_ok, d, row_stride, R), similarity_constant)
    return factors


@triton.jit
def _whole_chunks(q_ptr, k_ptr, d, q_stride, k_stride, FEATURES: tl.constexpr):
    """Whether the rows of both matrices [*, d] start on 16-byte boundaries and hold whole chunks of
    FEATURES features (any D that is a multiple of 16, with the allocator's alignment): then
    _dot_keys loads them as 128-bit vectors."""
    return ((((q_ptr.to(tl.int64) | k_ptr.to(tl.int64)) & 15) == 0) & (d % FEATURES == 0)
            & (q_stride % FEATURES == 0) & (k_stride % FEATURES == 0))


@triton.jit
def _dot_keys(q_ptr, k_ptr, q_rows, row_ok, cand, cand_ok, d, q_stride, k_stride, keys, WHOLE_CHUNKS: tl.constexpr,
              FEATURES: tl.constexpr):
    """keys + the dot products of the query rows q_rows and the candidate rows cand of q_ptr and k_ptr
    (d features, rows q_stride and k_stride apart), by tl.dot in IEEE float32 over chunks of
    FEATURES features, in feature order. With WHOLE_CHUNKS (_whole_chunks holds) q_rows are _query_starts and the loads are unmasked 128-bit
    vectors: a row or candidate past its extent reads row 0 instead, whose products no caller keeps;
    otherwise every element is masked (a scalar load each: ptxas cannot vectorise a per-feature
    mask), the tail chunk's missing features reading 0 (their +0 products leave every sum as it is).
    The arithmetic is the same."""
    first = 0
    if WHOLE_CHUNKS:
        # q_rows are the rows' starts here (_query_starts: once per program); the hints state what
        # _whole_chunks tested.
        cand = tl.where(cand_ok, cand, 0).to(tl.int64) * k_stride
        while first < d:
            features = first + tl.arange(0, FEATURES)
            q = tl.load(tl.multiple_of(q_ptr + q_rows[:, None] + features[None, :], [FEATURES, FEATURES]))
            k = tl.load(tl.multiple_of(k_ptr + cand[:, None] + features[None, :], [FEATURES, FEATURES]))
            q, k = q.to(tl.float32), k.to(tl.float32)  # half precision exactly
            keys = tl.dot(q, tl.trans(k), keys, input_precision="ieee")
            first += FEATURES
    else:
        while first < d:
            features = first + tl.arange(0, FEATURES)
            feature_ok = features < d
            q = tl.load(q_ptr + q_rows.to(tl.int64)[:, None] * q_stride + features[None, :],
                        mask=row_ok[:, None] & feature_ok[None, :], other=0.0).to(tl.float32)
            k = tl.load(k_ptr + cand.to(tl.int64)[:, None] * k_stride + features[None, :],
                        mask=cand_ok[:, None] & feature_ok[None, :], other=0.0).to(tl.float32)
            keys = tl.dot(q, tl.trans(k), keys, input_precision="ieee")
            first += FEATURES
    return keys


@triton.jit
def squared_difference_added(diff, sums):
    """gaussian's step: sums + diff * diff as one FMA, written out (not left to the compiler's
    contraction) so that bounded_select.py's re-rank gives the same bits."""
    return tl.fma(diff, diff, sums)


@triton.jit
def _query_starts(q_rows, row_ok, q_stride):
    """The element offsets of the query rows' starts for _dot_keys' vector loads, row 0's for rows
    past N (read, never kept): once per program, not per tile."""
    return tl.where(row_ok, q_rows, 0).to(tl.int64) * q_stride


@triton.jit
def scaled_by_root(keys, root, SIMILARITY: tl.constexpr):
    """scaled_dot's keys of dot products: keys / root (sqrt(D) in float32), correctly rounded; the
    other similarities' keys as they are. Also the exact re-rank's (bounded_select.py), which must
    give these bits, and its upper bounds' (a correctly rounded quotient by root > 0 keeps order)."""
    if SIMILARITY == SCALED_DOT:
        # x / root correctly rounded. With root a power of two (D = 4, 16, 64, 256, ...) its
        # reciprocal is exact, so x * (1 / root) is the same correctly rounded quotient, at one
        # multiply instead of an IEEE division's dozen instructions.
        if (tl.full([], root, tl.float32).to(tl.int32, bitcast=True) & 0x7FFFFF) == 0:
            keys = keys * tl.math.div_rn(1.0, root)
        else:
            keys = tl.math.div_rn(keys, tl.full(keys.shape, root, tl.float32))
    return keys


@triton.jit
def _pair_keys(q_ptr, k_ptr, q_rows, row_ok, cand, cand_ok, d, q_stride, k_stride, similarity_constant, q_factors,
               SIMILARITY: tl.constexpr, ROWS: tl.constexpr, CANDIDATES: tl.constexpr, FEATURES: tl.constexpr,
               VECTOR_LOADS: tl.constexpr = False, q_starts=None):
    """[ROWS, CANDIDATES] ranking keys, in float32. similarity_constant: sqrt(D) rounded to float32
    for scaled_dot, the epsilon (kCosineEps in float32) for cosine, unread otherwise; q_factors:
    cosine's _row_factors of the query rows (once per program), unread otherwise. VECTOR_LOADS: the
    dot products take _dot_keys' vector loads where _whole_chunks holds (a branch per tile, the same
    arithmetic either way), from the rows' starts q_starts (_query_starts); the set held per thread
    asks for them (scripts/triton_cost_report.py: 386 -> 312 SASS per 16 features at K <= 8, sm_90);
    the shared set does not (with them, ptxas spilled 8-24 bytes for cosine with a mask at K <= 32,
    sm_90)."""
    # Dot products as tl.dot tiles in IEEE float32, FEATURES features at a time; the distances
    # (exact pairwise differences) one feature at a time. Register use measured with ptxas -v
    # (sm_80, sm_90): 32 query rows and a tile of all 64 features spilled kilobytes; 16 rows,
    # 8 warps and 16-feature chunks, none (scripts/triton_compile_check.py fails on a spill).
    keys = tl.zeros([ROWS, CANDIDATES], dtype=tl.float32)
    if is_dot_product(SIMILARITY):  # tl.dot over chunks of FEATURES features
        if VECTOR_LOADS:
            if _whole_chunks(q_ptr, k_ptr, d, q_stride, k_stride, FEATURES):
                keys = _dot_keys(q_ptr, k_ptr, q_starts, row_ok, cand, cand_ok, d, q_stride, k_stride, keys, True,
                                 FEATURES)
            else:
                keys = _dot_keys(q_ptr, k_ptr, q_rows, row_ok, cand, cand_ok, d, q_stride, k_stride, keys, False,
                                 FEATURES)
        else:
            keys = _dot_keys(q_ptr, k_ptr, q_rows, row_ok, cand, cand_ok, d, q_stride, k_stride, keys, False, FEATURES)
        if SIMILARITY == COSINE:
            # (q.k * (1/max(|q|,eps))) * (1/max(|k|,eps)) from the raw rows, in that order, as on
            # every path (src/ops/kernels/similarity.h): exactly orthogonal rows score exactly 0.
            k_factors = _row_factors(k_ptr, cand, cand_ok, d, k_stride, similarity_constant, SIMILARITY, CANDIDATES)
            keys = keys * q_factors[:, None] * k_factors[None, :]
        keys = scaled_by_root(keys, similarity_constant, SIMILARITY)
    else:  # the distances: minus the distance, from exact pairwise differences, a feature at a time
        tl.static_assert(is_distance(SIMILARITY))
        j = 0
        while j < d:
            qj = tl.load(q_ptr + q_rows.to(tl.int64) * q_stride + j, mask=row_ok, other=0.0).to(tl.float32)
            kj = tl.load(k_ptr + cand.to(tl.int64) * k_stride + j, mask=cand_ok, other=0.0).to(tl.float32)
            diff = qj[:, None] - kj[None, :]
            if SIMILARITY == GAUSSIAN:
                keys = squared_difference_added(diff, keys)
            elif SIMILARITY == CHEBYSHEV:
                keys = tl.maximum(keys, tl.abs(diff))
            else:
                tl.static_assert(SIMILARITY == L1)
                keys += tl.abs(diff)
            j += 1
        keys = -keys
    return keys


# Ranking keys. A float32 key's sign and magnitude bits read as a signed integer of the same order
# (_ordered), -0 and +0 both 0 (the two tie): -inf (masked) maps below every finite key, and
# UNFILLED below every key (NaN and +inf keys flag their row, unrankable, whatever they map to).
# The set shared by a row's threads packs the ordered key and the candidate index in one int64 (the
# index's 32-bit complement below it), so that one integer comparison applies the whole rule,
# larger first and the lower index on a tie; the set held by one thread compares the ordered keys
# alone and gets the tie rule from the order in which it takes the candidates (_thread_top_k).
UNFILLED = tl.constexpr(-(2**31))
LEAST_KEY = tl.constexpr(-(2**63))
GREATEST_KEY = tl.constexpr(2**63 - 1)
INDEX_BITS = tl.constexpr(2**32 - 1)


@triton.jit
def _ordered(keys):
    """int32 ranking keys of float32 keys, in the floats' order, -0 and +0 equal (both 0): the float's
    sign and magnitude as a two's-complement integer, sign * magnitude bits. Branch-free in three
    integer instructions (a select of the -0 case and of the sign took seven per key, sm_90)."""
    bits = keys.to(tl.int32, bitcast=True)
    sign = bits >> 31  # 0 or -1
    return ((bits & 0x7FFFFFFF) ^ sign) - sign


@triton.jit
def _unordered(ordered):
    """The float32 keys of int32 ranking keys: the inverse of _ordered (0 gives +0)."""
    return tl.where(ordered < 0, (-ordered) | (-(2**31)), ordered).to(tl.float32, bitcast=True)


@triton.jit
def _packed(keys, cand):
    """int64 ranking keys of float32 keys [ROWS, CANDIDATES] and their candidate indices."""
    return (_ordered(keys).to(tl.int64) << 32) | (cand.to(tl.int64) ^ INDEX_BITS)


@triton.jit
def _unpacked(packed):
    """(float32 keys, int32 indices) of packed ranking keys: the inverse of _packed."""
    return _unordered((packed >> 32).to(tl.int32)), ((packed & INDEX_BITS) ^ INDEX_BITS).to(tl.int32)


@triton.jit
def _tile_keys(q_ptr, k_ptr, mask_ptr, q_rows, rows, row_ok, cand, cand_ok, m, d, q_stride, k_stride,
               similarity_constant, q_factors, SIMILARITY: tl.constexpr, MASK: tl.constexpr,
               ROWS: tl.constexpr,
               CANDIDATES: tl.constexpr, FEATURES: tl.constexpr):
    """The [ROWS, CANDIDATES] tile's ranking keys in float32 with the mask applied (a false bool
    entry: -inf; an additive one added; mask_ptr at the slice's mask: mask_slice_start), and which
    rows met a NaN or +inf key among the valid pairs ([ROWS] int32, 1 if so)."""
    keys = _pair_keys(q_ptr, k_ptr, q_rows, row_ok, cand, cand_ok, d, q_stride, k_stride, similarity_constant,
                      q_factors, SIMILARITY, ROWS, CANDIDATES, FEATURES)
    both_ok = row_ok[:, None] & cand_ok[None, :]
    keys = _masked(keys, mask_ptr + rows.to(tl.int64)[:, None] * m + cand[None, :], both_ok, MASK)
    return keys, tl.max(_unrankable(keys, both_ok), 1)


@triton.jit
def mask_slice_start(g, mask_slice_stride, slices_per_mask_slice):
    """The offset of query slice g's mask slice: one serves slices_per_mask_slice consecutive query
    slices (docs/operator.md, "Masks": a per-sample mask its sample's heads, read in place), the mask
    slices mask_slice_stride apart (0: one mask for every slice). g < 2^16 (the launchers' grids): a
    32-bit division."""
    return (g.to(tl.int32) // slices_per_mask_slice).to(tl.int64) * mask_slice_stride


@triton.jit
def _masked(keys, mask_at, valid, MASK: tl.constexpr):
    """keys with the mask applied, read at mask_at where valid: a false bool entry makes the key -inf,
    an additive entry is added in float32; without a mask, keys."""
    if MASK == 1:
        keys = tl.where(tl.load(mask_at, mask=valid, other=0) != 0, keys, float("-inf"))
    elif MASK == 2:
        keys += tl.load(mask_at, mask=valid, other=0.0).to(tl.float32)
    return keys


@triton.jit
def _unrankable(keys, valid):
    """1 where a valid pair's key is NaN or +inf, whose row cannot be ranked: its scores come out NaN,
    as the generic path's (docs/operator.md, "NaN and Inf rule")."""
    return (valid & ((keys != keys) | (keys == float("inf")))).to(tl.int32)


@triton.jit
def _running_top_k(q_ptr, k_ptr, mask_ptr, rows, row_ok, m, d, k, q_stride, k_stride, similarity_constant,
                   SIMILARITY: tl.constexpr, MASK: tl.constexpr, ROWS: tl.constexpr, CANDIDATES: tl.constexpr,
                   SLOTS: tl.constexpr, FEATURES: tl.constexpr, SHARED_SET: tl.constexpr):
    """The K best candidates of each of the ROWS query rows of a slice (q_ptr and k_ptr at the slice's
    first row: row_chunks.slice_starts; rows q_stride and k_stride apart; mask_ptr at its mask:
    mask_slice_start), best first: (keys [ROWS,
    SLOTS] float32, indices [ROWS, SLOTS] int32, unrankable [ROWS]: rows that met a NaN or +inf key).
    Shared by the select kernel and the fused attention kernel (attention.py). At K <= THREAD_SLOTS
    each row's set is held by one thread (_thread_top_k), above by the threads of a row together
    (_shared_top_k); the launch options and ROWS follow (design). SHARED_SET takes
    the shared set at every K: no launch asks for it, scripts/gpu_bench.py times the two designs with
    it on one GPU (the per-thread set trades occupancy for instructions: select.py's THREAD_OPTIONS)."""
    if SLOTS <= _THREAD_SLOTS and not SHARED_SET:
        top_keys, top_index, unrankable = _thread_top_k(q_ptr, k_ptr, mask_ptr, rows, row_ok, m, d, q_stride,
                                                        k_stride, similarity_constant, SIMILARITY, MASK,
                                                        ROWS, CANDIDATES, SLOTS, FEATURES)
    else:
        top_keys, top_index, unrankable = _shared_top_k(q_ptr, k_ptr, mask_ptr, rows, row_ok, m, d, k,
                                                        q_stride, k_stride, similarity_constant, SIMILARITY, MASK,
                                                        ROWS, CANDIDATES, SLOTS, FEATURES)
    in_k = tl.arange(0, SLOTS)[None, :] < k
    return tl.where(in_k, top_keys, float("-inf")), tl.where(in_k, top_index, m), unrankable


@triton.jit
def _thread_top_k(q_ptr, k_ptr, mask_ptr, rows, row_ok, m, d, q_stride, k_stride, similarity_constant,
                  SIMILARITY: tl.constexpr, MASK: tl.constexpr, ROWS: tl.constexpr, CANDIDATES: tl.constexpr,
                  SLOTS: tl.constexpr, FEATURES: tl.constexpr):
    """The running top-K held a query row per thread (issue 38: a selection without merge rounds or
    shuffles). Each row keeps its SLOTS best as a sorted tuple of [ROWS] registers. Each score tile
    is split down to its columns (tl.split moves a row's candidates into its thread), and each
    column, its mask applied in the thread, is inserted into the row's sorted slots without a
    branch (_insert). Candidates come in ascending index (tiles in order, each tile's columns in
    order: _insert_columns) and a key moves past a slot only if it is strictly larger, so of equal
    keys the lower index stays ahead: the tie rule without comparing indices. Empty slots hold
    UNFILLED, below every real candidate (masked ones included), so a row with fewer than K valid
    candidates fills its slots with the masked ones, lower index first."""
    q_rows = rows  # of the slice q_ptr starts
    top = (tl.full([ROWS], UNFILLED, tl.int32),) * SLOTS
    index = (tl.full([ROWS], 0, tl.int32) + m,) * SLOTS
    unrankable = tl.zeros([ROWS], dtype=tl.int32)
    q_factors = _row_factors(q_ptr, q_rows, row_ok, d, q_stride, similarity_constant, SIMILARITY, ROWS)
    mask_rows = mask_ptr + rows.to(tl.int64) * m  # unread without a mask
    q_starts = _query_starts(q_rows, row_ok, q_stride)
    first = 0
    while first < m:
        cand = first + tl.arange(0, CANDIDATES)
        keys = _pair_keys(q_ptr, k_ptr, q_rows, row_ok, cand, cand < m, d, q_stride, k_stride, similarity_constant,
                          q_factors, SIMILARITY, ROWS, CANDIDATES, FEATURES, VECTOR_LOADS=True, q_starts=q_starts)
        top, index, unrankable = _insert_columns(top, index, unrankable, keys, first, mask_rows, row_ok, m, MASK)
        first += CANDIDATES
    return _unordered(_stacked(top)), _stacked(index), unrankable


@triton.jit
def _insert_column(top, index, unrankable, key, column, mask_rows, row_ok, m, MASK: tl.constexpr):
    """Candidate `column`'s float32 keys [ROWS] through the mask, the NaN and +inf rule and _insert
    (a column past the candidates enters as UNFILLED: never)."""
    valid = column < m
    key = _masked(key, mask_rows + column, row_ok & valid, MASK)
    unrankable |= _unrankable(key, row_ok & valid)
    top, index = _insert(top, index, tl.where(valid, _ordered(key), UNFILLED), column)
    return top, index, unrankable


@triton.jit
def _insert(top, index, key, key_index):
    """One candidate per row (key [ROWS], of index key_index) into the sorted slots (top, index): it goes
    above the first slot whose key it strictly exceeds, and the slots from there move down one (the
    last drops out). Every slot compares with the candidate alone, so the comparisons do not wait on
    each other."""
    new_top, new_index = top, index
    for slot in tl.static_range(len(top)):
        larger = key > top[slot]
        if slot == 0:
            arriving, arriving_index = key, key_index
        else:  # the slot above's key if the candidate went above that one too, else the candidate
            arriving = tl.where(larger_above, top[slot - 1], key)
            arriving_index = tl.where(larger_above, index[slot - 1], key_index)
        new_top = new_top[:slot] + (tl.where(larger, arriving, top[slot]),) + new_top[slot + 1:]
        new_index = new_index[:slot] + (tl.where(larger, arriving_index, index[slot]),) + new_index[slot + 1:]
        larger_above = larger
    return new_top, new_index


@triton.jit
def _halves(x):
    """The first and second halves of the columns of x [R, W] (W >= 4), each [R, W / 2]."""
    return tl.split(tl.permute(tl.reshape(x, [x.shape[0], 2, x.shape[1] // 2]), (0, 2, 1)))


@triton.jit
def _insert_columns(top, index, unrankable, keys, first, mask_rows, row_ok, m, MASK: tl.constexpr):
    """Every column of keys [ROWS, W] (W a power of two), in column order, through _insert_column:
    column j is candidate first + j."""
    if keys.shape[1] == 2:
        left, right = tl.split(keys)
        top, index, unrankable = _insert_column(top, index, unrankable, left, first, mask_rows, row_ok, m, MASK)
        top, index, unrankable = _insert_column(top, index, unrankable, right, first + 1, mask_rows, row_ok, m, MASK)
    else:
        left, right = _halves(keys)
        top, index, unrankable = _insert_columns(top, index, unrankable, left, first, mask_rows, row_ok, m, MASK)
        top, index, unrankable = _insert_columns(top, index, unrankable, right, first + keys.shape[1] // 2,
                                                 mask_rows, row_ok, m, MASK)
    return top, index, unrankable


@triton.jit
def _stacked(parts):
    """The tuple of 2^B tensors [R] as one tensor [R, 2^B], parts[i] in column i."""
    if len(parts) == 2:
        stacked = tl.join(parts[0], parts[1])
    else:
        pairs = tl.join(_stacked(parts[:len(parts) // 2]), _stacked(parts[len(parts) // 2:]))  # [R, W / 2, 2]
        stacked = tl.reshape(tl.permute(pairs, (0, 2, 1)), [pairs.shape[0], len(parts)])
    return stacked


@triton.jit
def _shared_top_k(q_ptr, k_ptr, mask_ptr, rows, row_ok, m, d, k, q_stride, k_stride, similarity_constant,
                  SIMILARITY: tl.constexpr, MASK: tl.constexpr, ROWS: tl.constexpr, CANDIDATES: tl.constexpr,
                  SLOTS: tl.constexpr, FEATURES: tl.constexpr):
    """The running top-K shared by the threads of a row, for K above THREAD_SLOTS (issue 38:
    selection without merge rounds). Each row keeps its K best packed keys as an unordered set and
    their least, the threshold. A tile's keys are gated against the threshold; the ones that pass
    enter one per row per round, each replacing the set's least (the keys are distinct, so exactly
    one slot holds it), for as many rounds as the block's busiest row has entries (at most K: after K
    no key left in the tile beats the set), so none once the thresholds settle. One sort of the K
    slots at the end puts them best first (bitonic.py)."""
    q_rows = rows  # of the slice q_ptr starts
    slots = tl.arange(0, SLOTS)
    in_k = slots[None, :] < k
    # Empty slots: -inf keys of indices m+1, m+2, ... (distinct, and below every real candidate:
    # k <= m, so the set fills with real ones); slots past K hold the greatest key, never the least.
    empty = _packed(tl.full([ROWS, SLOTS], float("-inf"), tl.float32),
                    m + 1 + slots[None, :] + tl.zeros([ROWS, SLOTS], tl.int32))
    top = tl.where(in_k, empty, GREATEST_KEY)
    threshold = tl.min(top, 1)
    unrankable = tl.zeros([ROWS], dtype=tl.int32)
    q_factors = _row_factors(q_ptr, q_rows, row_ok, d, q_stride, similarity_constant, SIMILARITY, ROWS)
    first = 0
    while first < m:
        cand = first + tl.arange(0, CANDIDATES)
        cand_ok = cand < m
        keys, bad = _tile_keys(q_ptr, k_ptr, mask_ptr, q_rows, rows, row_ok, cand, cand_ok, m, d, q_stride, k_stride,
                               similarity_constant, q_factors, SIMILARITY, MASK, ROWS, CANDIDATES, FEATURES)
        unrankable |= bad
        both_ok = row_ok[:, None] & cand_ok[None, :]
        packed = tl.where(both_ok, _packed(keys, cand[None, :] + tl.zeros([ROWS, CANDIDATES], tl.int32)),
                          LEAST_KEY)
        top, threshold = entered(top, threshold, packed, k)
        first += CANDIDATES
    top_keys, top_index = _unpacked(bitonic.largest(tl.where(in_k, top, LEAST_KEY), SLOTS, 1))
    return top_keys, top_index, unrankable


@triton.jit
def entered(top, threshold, packed, k):
    """The unordered set top [ROWS, SLOTS] of distinct packed keys (its least per row: threshold,
    [ROWS]) after a tile's packed keys [ROWS, W] (LEAST_KEY where invalid) have entered: the gate
    lets only keys above their row's threshold in; they enter one per row per round, each replacing
    its set's least, for as many rounds as the busiest row has entries, at most k (the slots in use:
    after k no key left in the tile beats the set). Returns (top, threshold)."""
    passing = tl.where(packed > threshold[:, None], packed, LEAST_KEY)
    entries = tl.minimum(tl.max(tl.sum((passing != LEAST_KEY).to(tl.int32), 1), 0), k)
    entry = 0
    while entry < entries:
        best = tl.max(passing, 1)
        enters = best > threshold
        top = tl.where(enters[:, None] & (top == threshold[:, None]), best[:, None], top)
        passing = tl.where(passing == best[:, None], LEAST_KEY, passing)
        threshold = tl.min(top, 1)
        entry += 1
    return top, threshold


@triton.jit
def _reported_scores(top_keys, unrankable, SIMILARITY: tl.constexpr):
    """The scores the op reports for ranking keys: exp(key) for the distances (exp(-distance); a
    masked slot reports -inf on every path), NaN in unrankable rows."""
    scores = top_keys
    if is_distance(SIMILARITY):
        scores = tl.where(top_keys == float("-inf"), float("-inf"), tl.exp(top_keys))
    return tl.where(unrankable[:, None] != 0, float("nan"), scores)


@triton.jit
def _select_kernel(q_ptr, k_ptr, mask_ptr, scores_ptr, indices_ptr, n, m, d, k, mask_slice_stride,
                   slices_per_mask_slice, similarity_constant, dtype_code, heads, q_batch_stride, q_head_stride,
                   q_row_stride, k_batch_stride, k_head_stride, k_row_stride, SIMILARITY: tl.constexpr,
                   MASK: tl.constexpr, ROWS: tl.constexpr, CANDIDATES: tl.constexpr, SLOTS: tl.constexpr,
                   FEATURES: tl.constexpr, SHARED_SET: tl.constexpr = False):
    # Slots by descending key (the launcher reorders them by index where asked). Queries and keys
    # in one of INPUT_DTYPES, a compiled kernel per dtype (the launcher converts an additive mask
    # to float32), the scores written in the op's dtype (dtype_code): a kernel per
    # similarity, slot width, mask kind and input dtype serves every order. A run-time choice of
    # the input dtype instead (a predicated load per dtype) doubled the SASS of the score tiles' loop
    # (108 -> 203 per 16 features, sm_90), and a branch per dtype around such loads failed to compile
    # in the fused attention kernel (Triton 3.6).
    # The mask kind stays a compile-time
    # choice: as a runtime one, ptxas spilled 8-24 bytes at K <= 16 and 64 (sm_80 and sm_90), and
    # so did a runtime index-order pass in the kernel (16 bytes, the distances at K <= 16, sm_80).
    # Queries and keys are read in place, any strides but the features' (row_chunks.slice_starts:
    # the launcher's RowLayout); the scores and indices are written contiguous [G, N, K].
    block = tl.program_id(0)
    g = tl.program_id(1).to(tl.int64)
    rows = block * ROWS + tl.arange(0, ROWS)
    select_rows(q_ptr, k_ptr, mask_ptr, scores_ptr, indices_ptr, g, rows, rows < n, n, m, d, k, mask_slice_stride,
                slices_per_mask_slice, similarity_constant, dtype_code, heads, q_batch_stride, q_head_stride,
                q_row_stride, k_batch_stride, k_head_stride, k_row_stride, SIMILARITY, MASK, ROWS, CANDIDATES, SLOTS,
                FEATURES, SHARED_SET)


@triton.jit
def select_rows(q_ptr, k_ptr, mask_ptr, scores_ptr, indices_ptr, g, rows, written_rows, n, m, d, k, mask_slice_stride,
                slices_per_mask_slice, similarity_constant, dtype_code, heads, q_batch_stride, q_head_stride,
                q_row_stride, k_batch_stride, k_head_stride, k_row_stride, SIMILARITY: tl.constexpr, MASK: tl.constexpr,
                ROWS: tl.constexpr, CANDIDATES: tl.constexpr, SLOTS: tl.constexpr, FEATURES: tl.constexpr,
                SHARED_SET: tl.constexpr):
    """The select kernel's work on the query rows `rows` of slice g: their K best candidates by the
    IEEE scores, written where written_rows ([ROWS], rows past N excluded): _select_kernel writes
    every row, bounded_select.py's rerun only the rows its tensor-core kernel could not settle."""
    row_ok = rows < n
    q_ptr += row_chunks.slice_starts(g, heads, q_batch_stride, q_head_stride)
    k_ptr += row_chunks.slice_starts(g, heads, k_batch_stride, k_head_stride)
    mask_ptr += mask_slice_start(g, mask_slice_stride, slices_per_mask_slice)
    top_keys, top_index, unrankable = _running_top_k(q_ptr, k_ptr, mask_ptr, rows, row_ok, m, d, k, q_row_stride,
                                                     k_row_stride, similarity_constant, SIMILARITY,
                                                     MASK, ROWS, CANDIDATES, SLOTS, FEATURES, SHARED_SET)
    scores = _reported_scores(top_keys, unrankable, SIMILARITY)
    slots = tl.arange(0, SLOTS)
    out = (g * n + rows)[:, None] * k + slots[None, :]
    written = (written_rows & row_ok)[:, None] & (slots[None, :] < k)
    store_as(scores_ptr, out, scores, written, dtype_code)
    tl.store(indices_ptr + out, top_index.to(tl.int64), mask=written)
