"""knn_select's scores on tensor cores with an exact re-rank (issue 41): the IEEE kernel's indices,
ties, slot order and NaN rows, bit for bit, from inexact scores.

select.py scores every pair in IEEE float32 on CUDA cores, so that a GPU ranks exactly as the CPU.
At long N those scores are the whole cost. Here a tile's scores come from tensor cores (bfloat16 and
float16 inputs as they are, float32 through FLOAT32_PRECISION), each with a bound on its distance
from the IEEE kernel's score (error_bound: docs/operator.md, "Scores on tensor cores", derives it
and states the accumulation model it assumes). Per query row, over [ROWS, CANDIDATES] tiles, STEP_TILES
of them a loop step (tiles_per_step: two where the registers allow one [ROWS, 2 CANDIDATES] product,
whose tiles the tensor memory accelerator copies: _tile_descriptors):

1. The gate: a candidate passes when its upper bound (score + bound, through the similarity's key
   and the mask: both keep order) is not below the row's threshold t, the K-th largest exact key of
   the candidates re-scored so far (-inf before K of them); dot and scaled_dot (without an additive
   mask) compare the bare product with t less the bound at the tile's largest key norm instead
   (_gate_thresholds: an FMA per row, not a norm read and an add per pair). Which candidates pass
   comes as LANES 32-bit words per row from a second, small tensor-core product (_passing_words: no
   scan, no exchange of the tile between threads), each word in the thread that holds its columns;
   each thread appends its words' indices to the row's queue in global memory (_appended, a round per
   candidate of the step's busiest word, at positions from one sum across the row's threads:
   _lane_counts). With a bool mask, two launches
   (PART): the first scores the block's leading tiles that the mask holds whole for every row (a
   causal mask's left of the block's diagonal: _tiles_whole) as without a mask; the second takes the
   others from its selection, one tile a step, where a tile in which no row of the block has both a
   true entry and a threshold above -inf is not scored: below -inf every valid candidate passes
   whatever its score; and the block's loop ends after the last tile its rows' true entries reach (a
   causal mask's: its diagonal tile) once no row's top has an empty slot. dot and
   scaled_dot (without an additive mask) start each row's t from a lower bound of its K-th exact key,
   from the first SEED_TILES tiles' products (_seed_thresholds_kernel, launched before), not at -inf
   (which let every candidate through until the first flush).
2. The flush, after a step that leaves FLUSH_AT or more candidates in a row's queue and after the
   last step: the queued candidates
   re-scored exactly, in the IEEE kernel's order of operations (a float32 FMA chain over the features
   in order: what tl.dot(input_precision="ieee") lowers to), ranked by the exact packed keys (larger
   first, the lower index on a tie) and merged into the row's exact top (bitonic.py); t rises to its
   K-th key.
3. Exactness: a candidate that was not queued had an upper bound below the threshold of its time,
   which was the K-th exact key of some K candidates, so at most the row's K-th exact key: its own
   exact key is strictly below the K-th, so it is not among the K best, ties included; a candidate
   whose key is -inf (masked) that was not queued came when K candidates of lower indices were
   ranked, each of which wins a tie with it. Every other candidate was re-scored and ranked exactly.
   So every row is settled, however many candidates the bounds cannot tell apart (duplicates,
   integer grids cost flushes, not exactness), except rows whose scores could be NaN or +inf or
   whose bounds could overflow (a query norm, or a key norm of the slice, NaN, infinite or above
   NORM_CEILING; a NaN or +inf additive mask entry) and rows of calls whose rows are not whole chunks
   of FEATURES on 16-byte boundaries: their flag in `redo` is set, and the rerun kernel, select.py's
   IEEE kernel on the flagged rows alone, writes them. No read back to the host: the launches (the
   keys' norms, a bool mask's words, this kernel, the rerun) are graph-capturable.

Under Triton's interpreter tl.dot ignores input_precision. INJECT (a test mode, never compiled for a
launch) scores in IEEE float32 instead (the IEEE kernel's products, on a GPU too) and adds to each
score an error of up to the bound, of either sign, placed adversarially; bound_scale inflates the
bound (an inflated bound is still a bound): the selection must equal the IEEE kernel's whatever the
errors (python/tests/test_bounded_select.py). STATS (tests, scripts/gpu_bench.py) writes the
candidates each row re-scored, the tiles its block scored and the tiles its block's loop took.

dot, scaled_dot, cosine and gaussian (SIMILARITIES): the bound is on the dot product; cosine's key
is monotone in it (times the rows' positive inverse norms), and gaussian's is bounded through
|q|^2 + |k|^2 - 2 q.k (gaussian_bound; tight where the points lie near the origin against their
distances: far from it, more candidates pass and are re-scored, the results as exact). chebyshev
and l1 stay on select.py's kernel, and so do widths above MAX_SLOTS and float32 inputs with an
additive mask above FLOAT32_MASK_SLOTS (compile_options).
"""
import os

import triton
import triton.language as tl

from . import bitonic, row_chunks, select
from .similarities import CODES, COSINE, DOT, GAUSSIAN, SCALED_DOT

# The similarities this kernel serves (codes; mirrored to the C++ launcher by scripts/triton_aot.py);
# the others stay on select.py's kernel.
SIMILARITIES = (CODES["dot"], CODES["scaled_dot"], CODES["cosine"], CODES["gaussian"])

# Query rows per program (one warpgroup's tensor-core tile: wgmma takes 64 rows), candidates per score
# tile (a bool mask's words of a row fill an int64), features per tl.dot chunk: a row of keys' chunk
# on 16-byte boundaries is a vector load (the launcher takes this kernel where the rows are whole chunks,
# select._whole_chunks; 16 rather than 32: ptxas spilled the masked variants at 32; a bool mask's
# one-tile steps multiply by two chunks at once, _staged_products' PRODUCT_FEATURES, and the two-tile
# step by TMA copies of DESCRIBED_FEATURES).
ROWS = 64
CANDIDATES = 64
FEATURES = 16
# A row's queue is flushed after a step that leaves FLUSH_AT or more candidates in it, so it holds at
# most FLUSH_AT - 1 + 2 * CANDIDATES, below QUEUE (a whole step may pass the gate; the appends write
# a row's free slot, below QUEUE, where it has no candidate left). Estimated by
# scripts/triton_cost_report.py (its simulation of this kernel's rules on Gaussian features, 12 x N,
# D 64, K 8, bfloat16's bound, and its SASS counts for sm_90, two tiles a step): per block of rows,
# thousands of warp instructions at N = 4096 / 16384 / 65536 70.6 / 127.6 / 305.6 flushing at 8 (83
# candidates re-scored per row at 16384), 67.5 / 125.3 / 305.9 at 12 (87), 67.3 / 123.7 / 302.3 at
# 16 (90), 67.8 / 125.5 / 307.5 at 24 (99) and 70.0 / 127.8 / 309.7 at 32 (104). Flushing more often
# re-scores fewer candidates but runs the flush's fixed part and its busiest row's chunks more
# often: 16 (with one tile a step, before, 16 too).
FLUSH_AT = 16
QUEUE = FLUSH_AT + 2 * CANDIDATES
# Queued candidates re-scored at a time per row: a [ROWS, FLUSH, 8] tile of keys' features in registers.
FLUSH = 8
# Key rows per program of _key_norms_kernel (whole tiles of CANDIDATES: it writes their largest norms).
KEY_NORM_ROWS = 128
# The sections of the keys' norms buffer, [G, NORM_SECTIONS, M + 1] float32 (_key_norms_kernel).
NORM_SECTIONS = 4
_NORM_SECTIONS = tl.constexpr(NORM_SECTIONS)
# Tiles at the start of a row whose products seed its threshold (_seed_thresholds_kernel): more
# re-score fewer candidates later and cost a product each. The static cost report's bounds (H100,
# 12 heads, D 64, K 8, bfloat16; µs at N = 16384 without a mask / causal, and 65536): 16 tiles 862 /
# 576, 9965 / 5577; 32 821 / 541, 9813 / 5441; 64 806 / 531, 9767 / 5385; 128 843 / 556, 9946 / 5552.
SEED_TILES = 64
_SEED_TILES = tl.constexpr(SEED_TILES)
# Tiles in flight in the seeds kernel's pipelined loop (_seed: TMA copies of the keys, three buffers).
SEED_STAGES = 3
_SEED_STAGES = tl.constexpr(SEED_STAGES)
# Features per staged product chunk of that kernel above D = 64 (_staged_products' PRODUCT_FEATURES; up
# to 64, TMA copies).
SEED_PRODUCT_FEATURES = 4 * FEATURES


def seed_warps(dtype):
    """The seeds kernel's warps for inputs of `dtype`: half precision 4, a warpgroup, whose rows lie in
    its warps, so that the K rounds' row reductions need no shared memory (sm_90, bfloat16, no mask:
    4 x 114 warp instructions a tile against 8 x 99, 4 x 191 a round against 8 x 130), at 142-228
    registers (sm_80, sm_90); float32 8 (with 4 ptxas spilled 8 bytes, a bool mask on sm_80; with 8,
    138-217 registers, none)."""
    return 8 if dtype == "float32" else 4


# Key rows a step loads at most (tiles_per_step's two tiles), addressed by 32-bit offsets from the step's
# first (_upper_keys; the launcher and _tile_offsets_fit check that they fit).
TILE_OFFSET_ROWS = 2 * CANDIDATES
_TILE_OFFSET_ROWS = tl.constexpr(TILE_OFFSET_ROWS)
# Features a copy of the two-tile step's tiles holds (sm_90: _tile_descriptors): the block's queries
# [ROWS, 64], copied once a block, and the step's keys [2 CANDIDATES, 64], by the tensor memory
# accelerator (TMA) into shared memory, zero past D, N and M: a row of a copy is 128 bytes in half
# precision, the widest swizzle's.
DESCRIBED_FEATURES = 64
_DESCRIBED_FEATURES = tl.constexpr(DESCRIBED_FEATURES)
# The words a row's passing candidates come in (_passing_words): one per thread of the four that hold
# the row in the products' layout, so that the appends run on a thread's own words.
LANES = 4
_LANES = tl.constexpr(LANES)
# Whether the kernels run under Triton's interpreter, which has no inline PTX (_rounded_gate, _popcount,
# _stored_where_held).
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")
# Mask rows per program of _mask_bits_kernel.
MASK_BITS_ROWS = 32
# The persistent grid's most programs (the launcher's: fewer where there are fewer blocks of rows):
# its queues' scratch is PROGRAMS x ROWS x QUEUE int32, 24 MiB, whatever the call's size; an H100
# holds 264 such programs at once (two per SM at 255 registers).
PROGRAMS = 1024
# The widest top-K this kernel holds (larger K stays on the IEEE kernel): at 32 and 64 slots ptxas
# spilled 16-770 bytes (sm_80, sm_90) with 4 warps or 8.
MAX_SLOTS = 16
# The widest top-K of float32 inputs with an additive mask (compile_options): at 16 slots ptxas
# spilled 8-56 bytes (8 warps, sm_80 and sm_90, most similarities, either mask kind while a bool mask
# was read as bytes); at 8, none, since the keys' inverse norms come from _key_norms_kernel. A bool
# mask, read as words (_mask_bits_kernel), fits 16 (246-255 registers, no spill).
FLOAT32_MASK_SLOTS = 8


def compile_options(slots, mask_kind, dtype):
    """The launch options of the kernel at this width, mask kind and input dtype, or None where the
    IEEE kernel keeps the call. ptxas (maxnreg 255): half precision without a mask, or with a bool one
    (read as words) up to 8 slots, fits 4 warps (a warpgroup, the fewest instructions per score: 8
    warps issue nearly twice as many per tile, the row reductions and barriers shared by fewer
    scores; a bool mask read as bytes spilled at 4, and at 16 slots as words 8-40 bytes on sm_80 once
    the tile loop ended at the rows' last true entry); with an additive mask, or float32 inputs, 4
    warps spilled 8-1116 bytes and 8 do not; float32 with an additive mask above FLOAT32_MASK_SLOTS
    spilled even with 8 (so it stays on the IEEE kernel), as every width above MAX_SLOTS."""
    if slots > MAX_SLOTS or (dtype == "float32" and mask_kind == 2 and slots > FLOAT32_MASK_SLOTS):
        return None
    warpgroup = dtype != "float32" and (mask_kind == 0 or (mask_kind == 1 and slots <= 8))
    return {"num_warps": 4 if warpgroup else 8, "maxnreg": 255}


# The C++ launcher (src/ops/cuda/triton/select_launches.cpp) takes this kernel only where asked
# (CONVNN_SELECT_SCORES=tensor_cores), as long as no GPU has timed it (scripts/gpu_bench.py
# --tensor-cores); the static cost report estimates it (BENCHMARKS.md).

# The widest features the error bound holds for (error_bound: 3 * D * 2^-22 < 1/2 with room).
MAX_FEATURES = 2 ** 18
# The tensor-core product of float32 inputs: "tf32", whose bound at D = 64 is about 2^-9 of |q||k|,
# rather than "tf32x3" (three TF32 products of split inputs, about 2^-14) at three times the
# tensor-core work and its splits on CUDA cores. A looser bound costs only candidates re-scored (no
# row is left to the rerun for it): measured under the interpreter with errors scattered up to the
# bound (64 rows, D = 64, K = 8, test_candidates_rescored_choose_the_float32_precision), per row on
# Gaussian features (M = 1024) 9.3 with TF32, 8.4 with tf32x3, and on tight clusters (noise 1%,
# M = 2048) 63.1 against 9.3 (the rows started from their seeds, _seed_thresholds_kernel; from the
# first tile's lower bounds 50.2 / 48.4 and 77.8 / 63.9): TF32's 54 more re-scores of a clustered row,
# 64 FMAs each, cost far less than tf32x3's two more products of each of its 2048 pairs, and tf32x3
# adds work on every tile.
FLOAT32_PRECISION = "tf32"
# Test modes of the injected score errors (INJECT): none (every launch), a pseudo-random fraction of
# the bound of either sign, plus the bound on even candidates and minus on odd ones or the reverse,
# and a slope from minus the bound at candidate 0 to plus at the last or the reverse (the lower
# index, which wins exact ties, pushed below its equals or above them).
INJECTIONS = {"none": 0, "scattered": 1, "even up": 2, "odd up": 3, "later up": 4, "earlier up": 5}


# The error model (docs/operator.md, "Scores on tensor cores"): float32's unit roundoff; each
# accumulation step of a tensor core's float32 sum, relative to the magnitudes summed, assumed at
# most 4 units (twice truncation's: multi-term adders align a group's products to its largest
# exponent); the subnormal range, where products and sums may be flushed.
_UNIT = tl.constexpr(2.0 ** -24)
_TENSOR_CORE_STEP = tl.constexpr(2.0 ** -22)
_FLUSHED = tl.constexpr(2.0 ** -124)
# Norms are raised to at least this, so that terms proportional to one norm (flushed subnormal
# inputs) are bounded by a multiple of the product of the norms.
NORM_FLOOR = tl.constexpr(2.0 ** -48)
# Rows and candidates with a larger norm (or a NaN one) go to the rerun: below it |q||k| <= 2^126,
# so no IEEE dot product, no bound and no key of theirs overflows.
NORM_CEILING = tl.constexpr(2.0 ** 63)


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
def gaussian_bound(d, model, absolute):
    """(factor, additive), float32 scalars: with Q and K a row's and a candidate's sums of squares
    (select.sums_of_squares), P their tensor-core dot product and model, absolute error_bound's,
    gaussian's IEEE key -D (D the FMA chain of the squared differences, select.py) is at most
    2 P - factor * (Q + K) + additive, as _upper_keys evaluates it (docs/operator.md, "Scores on
    tensor cores", derives it): each sum's own chain, the dot product's bound (2 |q||k| <= Q + K),
    D's chain against the exact distance, and 16 units more for the roundings of the evaluation."""
    features = d.to(tl.float32)
    sums = _gamma(features, _UNIT)               # Q's and K's chains against the exact sums
    products = model * (1.0 + 3.0 * _UNIT)       # the dot product's bound, in units of Q + K
    distance = _gamma(features + 2.0, _UNIT)     # D's chain, the differences rounded
    spread = 2.0 + 2.0 * sums + 2.0 * products   # |Q + K - 2 P| at most spread * (Q + K), and small terms
    c = (sums + products + distance * spread + 16.0 * _UNIT) * (1.0 + 2.0 ** -16)
    additive = 4.0 * (features * 2.0 ** -124 + model * 2.0 ** -96 + absolute)  # underflow, the norms' floor
    return 1.0 - c, additive


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
def _chunk_product(q_ptr, k_ptr, q_starts, k_starts, first, acc, FEATURES: tl.constexpr, PRECISION: tl.constexpr,
                   INJECT: tl.constexpr):
    """acc (None: zeros) + the tile's products over features first .. first + FEATURES - 1, from vector
    loads (the rows whole chunks of FEATURES features on 16-byte boundaries: whole_chunks)."""
    features = first + tl.arange(0, FEATURES)
    q = tl.load(tl.multiple_of(q_ptr + q_starts[:, None] + features[None, :], [FEATURES, FEATURES]))
    k = tl.load(tl.multiple_of(k_ptr + k_starts[:, None] + features[None, :], [FEATURES, FEATURES]))
    return _products(q, k, acc, PRECISION, INJECT)


@triton.jit
def _products(q, k, acc, PRECISION: tl.constexpr, INJECT: tl.constexpr):
    """acc (None: zeros) + q @ k^T: on tensor cores, or with INJECT the IEEE kernel's products (so that
    the injected error is the whole error, on a GPU too)."""
    if INJECT == 0:
        acc = _tensor_core_dot(q, k, acc, PRECISION)
    else:
        acc = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), acc, input_precision="ieee")
    return acc


@triton.jit
def _tile_descriptors(q_ptr, k_ptr, n, m, d, q_stride, k_stride, vector_tiles, ROWS: tl.constexpr,
                      KEY_ROWS: tl.constexpr):
    """(q_desc, k_desc): TMA descriptors of the slice's queries [N, d] and keys [M, d], copied by blocks
    of [ROWS, DESCRIBED_FEATURES] and [KEY_ROWS, DESCRIBED_FEATURES] (_described_products). A
    descriptor needs a base on 16 bytes and row strides of whole 16 bytes, which the rows hold where
    vector_tiles does (the launcher takes this kernel only then); where it does not, no tile is
    scored, but the block's queries are copied all the same: the descriptors then hold one row of the
    base rounded down to 16 bytes, inside the tensor's allocation (which starts on 16 bytes), at a
    stride of 16 elements."""
    element_bytes: tl.constexpr = q_ptr.dtype.element_ty.primitive_bitwidth // 8
    q_base = q_ptr - (q_ptr.to(tl.int64) & 15) // element_bytes
    k_base = k_ptr - (k_ptr.to(tl.int64) & 15) // element_bytes
    q_desc = tl.make_tensor_descriptor(q_base, shape=[tl.where(vector_tiles, n, 1), d],
                                       strides=[tl.where(vector_tiles, q_stride, 16), 1],
                                       block_shape=[ROWS, _DESCRIBED_FEATURES])
    k_desc = tl.make_tensor_descriptor(k_base, shape=[tl.where(vector_tiles, m, 1), d],
                                       strides=[tl.where(vector_tiles, k_stride, 16), 1],
                                       block_shape=[KEY_ROWS, _DESCRIBED_FEATURES])
    return q_desc, k_desc


@triton.jit
def _described_products(q_tile, q_desc, k_desc, first_row, first_candidate, d, PRECISION: tl.constexpr,
                        INJECT: tl.constexpr):
    """The step's [ROWS, KEY_ROWS] products from TMA copies (_tile_descriptors): the block's first
    DESCRIBED_FEATURES features (q_tile, copied once a block) by the step's keys', then any further
    features by chunks of both, the queries' copied again (D above DESCRIBED_FEATURES; q_desc None:
    the caller's D is not, and the products take no loop, which Triton's pipeliner needs). The copies put
    their tiles in shared memory, where the tensor cores read them: no registers hold them (the
    register-staged products of _chunk_product took two memory round trips a step at D = 64, and at
    one, 64 features a chunk, spilled), and the block's queries are read once, not every step."""
    approx = _products(q_tile, k_desc.load([first_candidate, 0]), None, PRECISION, INJECT)
    if q_desc is not None:
        first = _DESCRIBED_FEATURES
        while first < d:
            approx = _products(q_desc.load([first_row, first]), k_desc.load([first_candidate, first]), approx,
                               PRECISION, INJECT)
            first += _DESCRIBED_FEATURES
    return approx


@triton.jit
def _staged_products(q_ptr, k_ptr, q_rows, row_ok, cand, first_row, first_candidate, m, d, q_stride, k_stride,
                     FEATURES: tl.constexpr, PRECISION: tl.constexpr, INJECT: tl.constexpr,
                     PRODUCT_FEATURES: tl.constexpr):
    """_upper_keys' products [ROWS, W] from loads into registers, staged in shared memory for the
    tensor cores, addressed by 32-bit offsets from the rows first_row and first_candidate
    (_tile_offsets_fit), whose 64-bit addresses are a scalar each; the rows past N read first_row,
    the candidates past M row M - 1. By chunks of PRODUCT_FEATURES (FEATURES, twice or four times
    that), the first and last ones narrower where d is not a multiple of it (halving down to
    FEATURES): each chunk's keys are loaded, staged and multiplied before the next chunk's load is
    issued (ptxas overlaps only the queries' loads), so a tile's latency grows with its chunks: at
    D = 64 four round trips to memory by chunks of 16, two by chunks of 32. Wider chunks spilled the
    masked variants (a bool mask's one-tile steps take 32 at 8 slots or fewer). The two-tile step
    (sm_90) takes TMA copies instead (_described_products): staged, its chunks of 64 spilled 16-20
    bytes, and of 32 it took two round trips a step at 254 registers."""
    # 32-bit offsets: a 64-bit product per loaded row each step took 140 of the two-tile step's 505
    # instructions a warp (sm_90). A minimum per candidate, not a select on cand_ok: one instruction.
    q_ptr += tl.cast(first_row, tl.int64) * q_stride
    k_ptr += tl.cast(first_candidate, tl.int64) * k_stride
    q_starts = tl.where(row_ok, tl.arange(0, q_rows.shape[0]), 0) * q_stride
    k_starts = tl.minimum(tl.arange(0, cand.shape[0]), m - 1 - first_candidate) * k_stride
    # The first chunk apart: its product starts the sum, no accumulator to clear per tile (d >= FEATURES).
    if PRODUCT_FEATURES == FEATURES:
        approx = _chunk_product(q_ptr, k_ptr, q_starts, k_starts, 0, None, FEATURES, PRECISION, INJECT)
        first = FEATURES
    else:
        tl.static_assert(PRODUCT_FEATURES == 2 * FEATURES or PRODUCT_FEATURES == 4 * FEATURES)
        if d >= PRODUCT_FEATURES:
            approx = _chunk_product(q_ptr, k_ptr, q_starts, k_starts, 0, None, PRODUCT_FEATURES, PRECISION, INJECT)
            first = PRODUCT_FEATURES
        elif PRODUCT_FEATURES == 4 * FEATURES and d >= 2 * FEATURES:
            approx = _chunk_product(q_ptr, k_ptr, q_starts, k_starts, 0, None, 2 * FEATURES, PRECISION, INJECT)
            first = 2 * FEATURES
        else:
            approx = _chunk_product(q_ptr, k_ptr, q_starts, k_starts, 0, None, FEATURES, PRECISION, INJECT)
            first = FEATURES
    while first + PRODUCT_FEATURES <= d:
        approx = _chunk_product(q_ptr, k_ptr, q_starts, k_starts, first, approx, PRODUCT_FEATURES, PRECISION, INJECT)
        first += PRODUCT_FEATURES
    if PRODUCT_FEATURES == 4 * FEATURES:
        if first + 2 * FEATURES <= d:
            approx = _chunk_product(q_ptr, k_ptr, q_starts, k_starts, first, approx, 2 * FEATURES, PRECISION, INJECT)
            first += 2 * FEATURES
    if PRODUCT_FEATURES != FEATURES:
        if first < d:  # d an odd multiple of FEATURES: its last chunk
            approx = _chunk_product(q_ptr, k_ptr, q_starts, k_starts, first, approx, FEATURES, PRECISION, INJECT)
    return approx


@triton.jit
def _upper_keys(q_ptr, k_ptr, norms_ptr, q_rows, row_ok, cand, cand_ok, first_row, first_candidate, m, d, q_stride,
                k_stride, q_norms, row_terms, q_factors, model, absolute, factor, half_additive, similarity_constant,
                SIMILARITY: tl.constexpr, FEATURES: tl.constexpr, PRECISION: tl.constexpr, INJECT: tl.constexpr,
                TILE_BOUND: tl.constexpr, PRODUCT_FEATURES: tl.constexpr, q_tile=None, q_desc=None, k_desc=None):
    """[ROWS, CANDIDATES] float32 upper bounds of the IEEE kernel's keys of the tile's pairs, before
    scaled_dot's division (the gate compares dot products with _dot_threshold) and the mask, from the
    tensor-core product P and the slice's norms, sums of squares and inverse norms (norms_ptr,
    _key_norms_kernel):
    dot products P + row_terms * the candidate's norm (row_terms: the bound's coefficient times the
    row's norm), cosine's that times the row's and the candidate's inverse norms (its key is
    monotone in the dot product), gaussian's 2 P + row_terms + the candidate's term (gaussian_bound:
    row_terms is the row's -factor * Q + half_additive). q_rows are first_row + 0 .. ROWS - 1 and
    cand first_candidate + 0 .. W - 1. The products: with k_desc, by TMA copies (_described_products:
    the two-tile step's, q_tile the block's queries); else staged through registers
    (_staged_products). Rows past N and candidates past M get products of another row or of zeros,
    and NaN (NaN row terms, NaN norms), as rows that are not live: the gate lets no NaN through.
    TILE_BOUND (dot products without an additive mask): P itself, whose bound the gate takes from its
    threshold instead (_gate_thresholds; no candidate's norm read, nothing added per pair), and whose
    candidates past M the caller drops."""
    if k_desc is None:
        approx = _staged_products(q_ptr, k_ptr, q_rows, row_ok, cand, first_row, first_candidate, m, d, q_stride,
                                  k_stride, FEATURES, PRECISION, INJECT, PRODUCT_FEATURES)
    else:
        approx = _described_products(q_tile, q_desc, k_desc, first_row, first_candidate, d, PRECISION, INJECT)
    if INJECT != 0 or not TILE_BOUND:
        k_norms = tl.load(norms_ptr + cand, mask=cand_ok, other=float("nan"))
    if INJECT != 0:  # up to each pair's own bound: below the tile's that TILE_BOUND's gate takes
        approx += _injected(q_rows, cand, m, INJECT) * (model * q_norms[:, None] * k_norms[None, :] + absolute)
    if TILE_BOUND:
        upper = approx
    elif SIMILARITY == GAUSSIAN:
        k_squares = tl.load(norms_ptr + (m + 1) + cand, mask=cand_ok, other=float("nan"))
        upper = tl.fma(approx, 2.0, row_terms[:, None]) + tl.fma(-factor, k_squares, half_additive)[None, :]
    else:
        upper = approx + row_terms[:, None] * k_norms[None, :]
        if SIMILARITY == COSINE:
            k_factors = tl.load(norms_ptr + 2 * (m + 1) + cand, mask=cand_ok, other=0.0)
            upper = upper * q_factors[:, None] * k_factors[None, :]
    return upper


@triton.jit
def _squared_differences_chain(q, k, sums):
    """sums after select.squared_difference_added(q_f - k_f, .) over the 8 features of q [ROWS, 1, 8]
    and k [ROWS, W, 8], in order (gaussian's IEEE chain)."""
    q0, q1, q2, q3, q4, q5, q6, q7 = select.in_feature_order(q)
    k0, k1, k2, k3, k4, k5, k6, k7 = select.in_feature_order(k)
    sums = select.squared_difference_added(q0 - k0, sums)
    sums = select.squared_difference_added(q1 - k1, sums)
    sums = select.squared_difference_added(q2 - k2, sums)
    sums = select.squared_difference_added(q3 - k3, sums)
    sums = select.squared_difference_added(q4 - k4, sums)
    sums = select.squared_difference_added(q5 - k5, sums)
    sums = select.squared_difference_added(q6 - k6, sums)
    return select.squared_difference_added(q7 - k7, sums)


@triton.jit
def _as_float32(x):
    """x in float32, exactly. bfloat16 by pairs of its 32-bit registers (pack=2): a bfloat16 is the top
    half of its float32, so the low one shifted up and the high one masked, an instruction each, where
    Triton's conversion took a PRMT and an IMAD for each high half (the flush's re-score: a third of its
    instructions were conversions). Under the interpreter (no inline PTX), and for other dtypes, .to."""
    if x.dtype == tl.bfloat16 and not _INTERPRETED:
        return tl.inline_asm_elementwise("{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000; }", "=r,=r,r", [x],
                                         dtype=tl.float32, is_pure=True, pack=2)
    return x.to(tl.float32)


@triton.jit
def _exact_chain(q, k, sums, SIMILARITY: tl.constexpr):
    """sums after the 8 features of q [ROWS, 1, 8] and k [ROWS, W, 8], float32: gaussian's chain of
    squared differences, the others' FMA chain."""
    if SIMILARITY == GAUSSIAN:
        return _squared_differences_chain(q, k, sums)
    return select.fma_chain(q, k, sums)


@triton.jit
def _exact_keys(q_ptr, k_ptr, norms_ptr, q_rows, row_ok, q_factors, held, held_ok, m, d, q_stride, k_stride,
                similarity_constant, SIMILARITY: tl.constexpr, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """[ROWS, WIDTH] float32 keys of each row with the candidates `held` [ROWS, WIDTH] (before the
    mask), as select._pair_keys computes them on a GPU: tl.dot(input_precision="ieee") lowers to one
    FMA per feature, in feature order, from +0 (Triton's FMA dot: acc = fma(a_k, b_k, acc)), the
    padding features past D that it adds being (+0) * (+0), which leave every such sum as it is;
    cosine's ((q.k) * the row's inverse norm) * the candidate's, both from select.sums_of_squares
    (q_factors, and the keys' inverse norms at norms_ptr + 2 (m + 1)); gaussian's minus the chain of squared
    differences. 8 features a vector load (whole_chunks), two such loads of the rows and of the
    candidates issued before their chains (d is a multiple of FEATURES = 16 wherever a candidate is
    queued: _select_block scores no tile otherwise), so that a pass of 16 features waits on one round
    trip to memory, not two (the flush re-scores a queue's candidates in d / 16 such passes); 0 where
    not held_ok."""
    sums = tl.zeros([ROWS, WIDTH], dtype=tl.float32)
    q_starts = tl.where(row_ok, q_rows, 0).to(tl.int64) * q_stride
    k_starts = tl.where(held_ok, held, 0).to(tl.int64) * k_stride
    lanes = tl.arange(0, 8)[None, None, :]
    feature = 0
    while feature < d:
        # Each row's features loaded for each of its candidates (L1 serves the repeats): the rows' tile
        # [ROWS, 1, 8] took three layout conversions through shared memory to meet the candidates'.
        q_at = tl.broadcast_to(tl.multiple_of(q_ptr + q_starts[:, None, None] + feature + lanes, [1, 1, 16]),
                               [ROWS, WIDTH, 8])
        k_at = tl.multiple_of(k_ptr + k_starts[:, :, None] + feature + lanes, [1, 1, 16])
        q, q_next = tl.load(q_at), tl.load(q_at + 8)
        k, k_next = tl.load(k_at), tl.load(k_at + 8)
        sums = _exact_chain(_as_float32(q), _as_float32(k), sums, SIMILARITY)
        sums = _exact_chain(_as_float32(q_next), _as_float32(k_next), sums, SIMILARITY)
        feature += 16
    if SIMILARITY == GAUSSIAN:
        keys = -sums
    else:
        keys = sums
        if SIMILARITY == COSINE:
            k_factors = tl.load(norms_ptr + 2 * (m + 1) + held, mask=held_ok, other=0.0)
            keys = keys * q_factors[:, None] * k_factors
        keys = select.scaled_by_root(keys, similarity_constant, SIMILARITY)
    return tl.where(held_ok, keys, 0.0)


@triton.jit
def _row_norms(ptr, rows, row_ok, d, stride, ROWS: tl.constexpr, FEATURES: tl.constexpr):
    """([ROWS] the norms (_norms), [ROWS] the sums of squares (select.sums_of_squares)) of the rows
    `rows` of ptr."""
    squares = select.sums_of_squares(ptr, rows, row_ok, d, stride, ROWS)
    return _norms(squares), squares


@triton.jit
def _key_norms_kernel(k_ptr, norms_ptr, m, d, cosine_eps, heads, k_batch_stride, k_head_stride, k_row_stride,
                      BLOCK: tl.constexpr, FEATURES: tl.constexpr, CANDIDATES: tl.constexpr):
    # norms [G, NORM_SECTIONS, M + 1] float32, zeros on entry: each key row's norm (_norms), once for
    # every block of query rows, and after a slice's M norms 1 if one of them is NaN or above
    # NORM_CEILING (a key whose scores could be NaN, or overflow: the slice's rows go to the rerun),
    # else 0; then the rows' sums of squares (gaussian's), then their inverse norms as cosine's
    # (select.inverse_of_norms with cosine_eps, kCosineEps in float32: once per key, not a division per
    # tile); then, at j, the largest norm of the tile of CANDIDATES keys from j * CANDIDATES (the dot
    # products' gate, _gate_thresholds: one load per tile, not one per candidate).
    tl.static_assert(BLOCK % CANDIDATES == 0)
    g = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    k_ptr += row_chunks.slice_starts(g, heads, k_batch_stride, k_head_stride)
    norms, squares = _row_norms(k_ptr, rows, rows < m, d, k_row_stride, BLOCK, FEATURES)
    norms_ptr += g * _NORM_SECTIONS * (m + 1)
    tl.store(norms_ptr + rows, norms, mask=rows < m)
    tl.store(norms_ptr + (m + 1) + rows, squares, mask=rows < m)
    tl.store(norms_ptr + 2 * (m + 1) + rows, select.inverse_of_norms(squares, cosine_eps), mask=rows < m)
    tiles = tl.program_id(0) * (BLOCK // CANDIDATES) + tl.arange(0, BLOCK // CANDIDATES)
    tl.store(norms_ptr + 3 * (m + 1) + tiles, tl.max(tl.reshape(norms, [BLOCK // CANDIDATES, CANDIDATES]), 1),
             mask=tiles * CANDIDATES < m)
    if tl.max(((rows < m) & ~(norms <= NORM_CEILING)).to(tl.int32), 0) != 0:
        tl.atomic_max(norms_ptr + m, 1.0)


@triton.jit
def _dot_threshold(threshold, root, SIMILARITY: tl.constexpr):
    """[ROWS] the least float32 y whose key (select.scaled_by_root(y)) is at least `threshold`, a key:
    then key(y) >= threshold exactly where y >= that float, the key being monotone in y. So the gate
    compares the tile's dot-product bounds with it instead of dividing each by root. The other
    similarities: threshold (their bounds are keys).
    Steps a float at a time from threshold * root (a step or two from the answer), as long as a row
    needs it: the key is monotone, so the steps end; NaN stays NaN, -inf gives -inf."""
    y = threshold
    if SIMILARITY == SCALED_DOT:
        y = threshold * root
        lower = select._unordered(select._ordered(y) - 1)
        down = (y > float("-inf")) & (select.scaled_by_root(lower, root, SIMILARITY) >= threshold)
        while tl.max(down.to(tl.int32), 0) != 0:
            y = tl.where(down, lower, y)
            lower = select._unordered(select._ordered(y) - 1)
            down = (y > float("-inf")) & (select.scaled_by_root(lower, root, SIMILARITY) >= threshold)
        up = select.scaled_by_root(y, root, SIMILARITY) < threshold
        while tl.max(up.to(tl.int32), 0) != 0:
            y = tl.where(up, select._unordered(select._ordered(y) + 1), y)
            up = select.scaled_by_root(y, root, SIMILARITY) < threshold
    return y


@triton.constexpr_function
def _doublings(width, wanted):
    return (wanted // width).bit_length() - 1


@triton.jit
def _ascending_to(x, WIDTH: tl.constexpr):
    """x [R, W] ascending, preceded by LEAST_KEY up to WIDTH: still ascending, so that the larger of it
    and a descending row of WIDTH, position by position, is bitonic and holds the pair's WIDTH largest."""
    R: tl.constexpr = x.shape[0]
    W: tl.constexpr = x.shape[1]
    for doubling in tl.static_range(_doublings(W, WIDTH)):
        least = tl.full([R, W << doubling], select.LEAST_KEY, tl.int64)
        x = tl.reshape(tl.permute(tl.join(least, x), [0, 2, 1]), [R, W << (doubling + 1)])
    return x


@triton.jit
def _flushed(q_ptr, k_ptr, norms_ptr, mask_rows, queue, fill, top, unrankable, rows, row_ok, q_factors, m, d, k,
             q_stride, k_stride, similarity_constant, SIMILARITY: tl.constexpr, MASK: tl.constexpr,
             ROWS: tl.constexpr, SLOTS: tl.constexpr, QUEUE: tl.constexpr, FLUSH: tl.constexpr,
             CANDIDATES: tl.constexpr):
    """The queued candidates (fill [ROWS] of each row's queue) re-scored exactly and merged into the
    row's exact top (SLOTS packed keys, descending), FLUSH a time. Returns (top, unrankable, the K-th
    exact key [ROWS] float32, whether the top still has an empty slot [ROWS]: fewer than K candidates
    ranked). The queue is written and read by different threads: a barrier before (the appends done)
    and after (the reads done before the next appends)."""
    tl.debug_barrier()
    first = 0
    fullest = tl.max(fill, 0)
    while first < fullest:
        slot = first + tl.arange(0, FLUSH)
        queued = row_ok[:, None] & (slot[None, :] < fill[:, None])
        held = tl.load(queue + (tl.arange(0, ROWS)[:, None] * QUEUE + slot[None, :]), mask=queued, other=0)
        exact = _masked_by_bits(_exact_keys(q_ptr, k_ptr, norms_ptr, rows, row_ok, q_factors, held, queued, m, d,
                                            q_stride, k_stride, similarity_constant, SIMILARITY, ROWS, FLUSH),
                                mask_rows, held, queued, MASK, CANDIDATES)
        unrankable |= tl.max(select._unrankable(exact, queued), 1)
        incoming = bitonic.largest(tl.where(queued, select._packed(exact, held), select.LEAST_KEY), FLUSH, 0)
        top = bitonic.sorted_bitonic(tl.maximum(top, _ascending_to(incoming, SLOTS)), 1)
        first += FLUSH
    tl.debug_barrier()
    in_k = tl.arange(0, SLOTS)[None, :] < k
    kth_key, kth_index = select._unpacked(tl.min(tl.where(in_k, top, select.GREATEST_KEY), 1))
    return top, unrankable, kth_key, kth_index > m  # an empty slot's index is above M


@triton.jit
def _mask_bits_kernel(mask_ptr, bits_ptr, wholes_ptr, rows, n, m, words, ROWS: tl.constexpr,
                      CANDIDATES: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    # A bool mask of `rows` contiguous rows of M entries (a slice's [N, M], or all slices') as int64
    # words [rows, words + 1], the last column zeros on entry: bit c of word w set where the row holds
    # candidate w * CANDIDATES + c (the bits past M clear), and in the last column the words up to the
    # row's last true entry (its last nonzero word's index plus 1; 0 for a row without one). The
    # tensor-core kernel reads a row's tile of the mask as one word: 8 bytes per row, tile and head
    # where the bool mask is 64, and no conversion of its entries; and ends a block's tiles after the
    # last its rows' words reach. wholes [rows / n, cdiv(N, BLOCK_ROWS)] int32, at least `words` on entry:
    # each block of BLOCK_ROWS rows of a slice gets its first word that is not whole (all 64 bits set)
    # in some row (a partial last word is not), the tiles its part 1 scores as without a mask.
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cand = tl.program_id(1) * CANDIDATES + tl.arange(0, CANDIDATES)
    held = tl.load(mask_ptr + row[:, None] * m + cand[None, :], mask=(row < rows)[:, None] & (cand < m)[None, :],
                   other=0) != 0
    bit = tl.full([1, CANDIDATES], 1, tl.int64) << tl.arange(0, CANDIDATES).to(tl.int64)[None, :]
    word = tl.sum(tl.where(held, bit, 0), 1)
    row_words = bits_ptr + row * (words + 1)
    tl.store(row_words + tl.program_id(1), word, mask=row < rows)
    reached = (tl.program_id(1) + 1).to(tl.int64) + tl.zeros([ROWS], tl.int64)
    tl.atomic_max(row_words + words, reached, mask=(row < rows) & (word != 0))
    block = (row // n) * tl.cdiv(n, BLOCK_ROWS) + (row % n) // BLOCK_ROWS
    tl.atomic_min(wholes_ptr + block, tl.program_id(1) + tl.zeros([ROWS], tl.int32), mask=(row < rows) & (word != -1))


@triton.jit
def _mask_words(mask_rows, first, live, CANDIDATES: tl.constexpr):
    """[ROWS] int64: bit c set where a live row's bool mask holds candidate first + c (the rows' words
    at mask_rows, _mask_bits_kernel's: bits past M clear)."""
    return tl.sum(tl.load(mask_rows + first // CANDIDATES, mask=live[:, None], other=0), 1)


@triton.jit
def _masked_by_bits(keys, mask_rows, held, valid, MASK: tl.constexpr, CANDIDATES: tl.constexpr):
    """select._masked for the candidates `held` [ROWS, W]: a bool mask read from the rows' words at
    mask_rows (_mask_bits_kernel's), an additive one from its entries at mask_rows + held."""
    if MASK == 1:
        word = tl.load(mask_rows + held // CANDIDATES, mask=valid, other=0)
        keys = tl.where(((word >> (held % CANDIDATES).to(tl.int64)) & 1) != 0, keys, float("-inf"))
    else:
        keys = select._masked(keys, mask_rows + held, valid, MASK)
    return keys


@triton.jit
def _valid_lanes(first, m, SPAN: tl.constexpr):
    """[1, LANES] int32: the candidates below M of lane words of SPAN candidates (_passing_words) as bits."""
    remaining = tl.minimum(tl.maximum(m - first - tl.arange(0, _LANES)[None, :] * SPAN, 0), SPAN)
    return tl.where(remaining >= 32, -1, (tl.full([], 1, tl.int32) << tl.minimum(remaining, 31)) - 1)


@triton.jit
def _lanes_of(bits, CANDIDATES: tl.constexpr):
    """[ROWS, LANES] int32: the lane words (_passing_words, one tile) of a tile's [ROWS] int64 words."""
    SPAN: tl.constexpr = CANDIDATES // _LANES
    shifts = (tl.arange(0, _LANES)[None, :] * SPAN).to(tl.int64)
    return ((bits[:, None] >> shifts) & ((tl.full([], 1, tl.int64) << SPAN) - 1)).to(tl.int32)


@triton.constexpr_function
def _tile_bound(similarity, mask):
    """Whether the gate takes the dot products' bound from the threshold, at the tile's largest key
    norm (_gate_thresholds), rather than adding each pair's: dot and scaled_dot, unless an additive
    mask is added to the bounds pair by pair."""
    return similarity in (DOT, SCALED_DOT) and mask != 2


@triton.jit
def _largest_key_norm(norms_ptr, first, m, TILE_BOUND: tl.constexpr, CANDIDATES: tl.constexpr,
                      STEP_TILES: tl.constexpr):
    """With TILE_BOUND, the largest key norm of the step's STEP_TILES tiles (_key_norms_kernel; 0 for a
    tile past M: the section's spare entries, zeros, whose candidates the caller drops); else 0, unread.
    The two-tile step reads it before its products (TMA copies: no registers staged), so that the
    load's latency hides behind theirs; held through staged 64-feature products, it made ptxas spill
    16 bytes (sm_90)."""
    largest = 0.0
    if TILE_BOUND:
        largest = tl.load(norms_ptr + 3 * (m + 1) + first // CANDIDATES)
        if STEP_TILES == 2:
            largest = tl.maximum(largest, tl.load(norms_ptr + 3 * (m + 1) + first // CANDIDATES + 1))
    return largest


@triton.jit
def _gate_thresholds(threshold, row_terms, largest, TILE_BOUND: tl.constexpr):
    """[ROWS] what the step's bounds (_upper_keys) are compared with: the threshold; with TILE_BOUND,
    the threshold less row_terms times the largest key norm of the step's tiles (largest:
    _largest_key_norm), an FMA per row: a candidate whose tensor-core product P is below it has P +
    its bound below the threshold, since a float P at least a real a is at least a rounded to float
    (docs/operator.md). (One bound for the step's two tiles: a bound per tile, broadcast along the
    step's columns, was a [ROWS, 2 CANDIDATES] tensor converted between layouts through shared
    memory.) NaN row terms (rows not live) give NaN, which no P passes; a -inf threshold stays -inf."""
    if TILE_BOUND:
        threshold = tl.fma(-row_terms, largest, threshold)
    return threshold


@triton.jit
def _seed_columns(columns, largest, first, q_ptr, k_ptr, norms_ptr, mask_rows, rows, row_ok, first_row, live, m, d,
                  q_stride, k_stride, q_norms, row_terms, q_factors, model, absolute, factor, half_additive,
                  similarity_constant, SIMILARITY: tl.constexpr, MASKED: tl.constexpr, CANDIDATES: tl.constexpr,
                  FEATURES: tl.constexpr, PRECISION: tl.constexpr, INJECT: tl.constexpr,
                  PRODUCT_FEATURES: tl.constexpr, q_tile=None, k_desc=None):
    """(columns, largest) after the whole tile from `first` (_seed): columns [ROWS, CANDIDATES] raised
    to its tensor-core products P (where MASKED, only those of the candidates the bool mask holds), by a
    TMA copy of its keys (k_desc, with q_tile: D at most DESCRIBED_FEATURES) or staged; largest raised
    to its largest key norm. An element's work is one maximum (a bool mask's tiles add its bit's test):
    the bound is subtracted once, from the K-th largest column, at the largest norm of the tiles."""
    here = first + tl.arange(0, CANDIDATES)
    products = _upper_keys(q_ptr, k_ptr, norms_ptr, rows, row_ok, here, here < m, first_row, first, m, d, q_stride,
                           k_stride, q_norms, row_terms, q_factors, model, absolute, factor, half_additive,
                           similarity_constant, SIMILARITY, FEATURES, PRECISION, INJECT, True, PRODUCT_FEATURES,
                           q_tile, None, k_desc)
    if MASKED:
        word = _mask_words(mask_rows, first, live, CANDIDATES)
        allowed = ((word[:, None] >> tl.arange(0, CANDIDATES)[None, :].to(tl.int64)) & 1) != 0
        products = tl.where(allowed, products, float("-inf"))
    largest = tl.maximum(largest, tl.load(norms_ptr + 3 * (m + 1) + first // CANDIDATES))
    return tl.maximum(columns, products), largest


@triton.jit
def _seed_tiles_in_turn(columns, largest, first, end, q_ptr, k_ptr, norms_ptr, mask_rows, rows, row_ok, first_row,
                        live, m, d, q_stride, k_stride, q_norms, row_terms, q_factors, model, absolute, factor,
                        half_additive, similarity_constant, SIMILARITY: tl.constexpr, MASKED: tl.constexpr,
                        CANDIDATES: tl.constexpr, FEATURES: tl.constexpr, PRECISION: tl.constexpr,
                        INJECT: tl.constexpr, PRODUCT_FEATURES: tl.constexpr, q_tile=None, k_desc=None):
    """_seed_columns over the tiles from `first` to `end`, a tile after another (no pipelining)."""
    at = first + tl.zeros([], tl.int32)  # (first: 0 or a tensor)
    while at < end:
        columns, largest = _seed_columns(columns, largest, at, q_ptr, k_ptr, norms_ptr, mask_rows, rows, row_ok,
                                         first_row, live, m, d, q_stride, k_stride, q_norms, row_terms, q_factors,
                                         model, absolute, factor, half_additive, similarity_constant, SIMILARITY,
                                         MASKED, CANDIDATES, FEATURES, PRECISION, INJECT, PRODUCT_FEATURES, q_tile,
                                         k_desc)
        at += CANDIDATES
    return columns, largest


@triton.jit
def _seed_tiles(columns, largest, first, end, q_ptr, k_ptr, norms_ptr, mask_rows, rows, row_ok, first_row, live, m,
                d, q_stride, k_stride, q_norms, row_terms, q_factors, model, absolute, factor, half_additive,
                similarity_constant, q_tile, k_desc, SIMILARITY: tl.constexpr, MASKED: tl.constexpr,
                CANDIDATES: tl.constexpr, FEATURES: tl.constexpr, PRECISION: tl.constexpr, INJECT: tl.constexpr,
                PRODUCT_FEATURES: tl.constexpr):
    """_seed_columns over the tiles from `first` to `end`: where D is at most DESCRIBED_FEATURES, by TMA
    copies (k_desc; q_tile the block's queries, copied once) in a loop that Triton pipelines
    (SEED_STAGES: the copies, the norms' and the mask words' loads issued that many tiles ahead, where
    each tile's load was a round trip of its own); above it, staged by chunks (_staged_products), a
    tile after another."""
    if d <= _DESCRIBED_FEATURES and not _INTERPRETED:
        for at in tl.range(first, end, CANDIDATES, num_stages=_SEED_STAGES):
            columns, largest = _seed_columns(columns, largest, at, q_ptr, k_ptr, norms_ptr, mask_rows, rows, row_ok,
                                             first_row, live, m, d, q_stride, k_stride, q_norms, row_terms, q_factors,
                                             model, absolute, factor, half_additive, similarity_constant, SIMILARITY,
                                             MASKED, CANDIDATES, FEATURES, PRECISION, INJECT, PRODUCT_FEATURES, q_tile,
                                             k_desc)
    elif d <= _DESCRIBED_FEATURES:  # the interpreter's range() takes no runtime bound: the copies in turn
        columns, largest = _seed_tiles_in_turn(columns, largest, first, end, q_ptr, k_ptr, norms_ptr, mask_rows, rows,
                                               row_ok, first_row, live, m, d, q_stride, k_stride, q_norms, row_terms,
                                               q_factors, model, absolute, factor, half_additive, similarity_constant,
                                               SIMILARITY, MASKED, CANDIDATES, FEATURES, PRECISION, INJECT,
                                               PRODUCT_FEATURES, q_tile, k_desc)
    else:
        columns, largest = _seed_tiles_in_turn(columns, largest, first, end, q_ptr, k_ptr, norms_ptr, mask_rows, rows,
                                               row_ok, first_row, live, m, d, q_stride, k_stride, q_norms, row_terms,
                                               q_factors, model, absolute, factor, half_additive, similarity_constant,
                                               SIMILARITY, MASKED, CANDIDATES, FEATURES, PRECISION, INJECT,
                                               PRODUCT_FEATURES)
    return columns, largest


@triton.jit
def _seed(q_ptr, k_ptr, norms_ptr, mask_rows, rows, row_ok, first_row, live, m, d, k, q_stride, k_stride, q_norms,
          row_terms, q_factors, model, absolute, factor, half_additive, similarity_constant, whole, end, q_tile,
          k_desc, SIMILARITY: tl.constexpr, MASK: tl.constexpr, CANDIDATES: tl.constexpr, FEATURES: tl.constexpr,
          PRECISION: tl.constexpr, INJECT: tl.constexpr, PRODUCT_FEATURES: tl.constexpr):
    """[ROWS] t0, a lower bound of each row's K-th exact dot product, from the whole tiles before `end`
    (dot and scaled_dot without an additive mask: _tile_bound), or -inf; a bool mask's tests only on
    the tiles from `whole` (it holds those before it whole for every row of the block). Each column of
    the tiles (candidate c of every tile) keeps the largest tensor-core product P of its valid
    candidates: distinct columns, distinct candidates, so at least K candidates have P at least the
    K-th largest column, P_K, and each of them an exact dot product at least fl(P_K - row_terms * the
    tiles' largest key norm) (a float P at least a real number is at least that number rounded, and
    rounding is monotone): t0. -inf in a row with fewer than K columns holding a valid candidate, and
    in a row not live."""
    columns = tl.full([rows.shape[0], CANDIDATES], float("-inf"), tl.float32)
    columns, largest = _seed_tiles(columns, tl.zeros([], tl.float32), 0, whole, q_ptr, k_ptr, norms_ptr, mask_rows,
                                   rows, row_ok, first_row, live, m, d, q_stride, k_stride, q_norms, row_terms,
                                   q_factors, model, absolute, factor, half_additive, similarity_constant, q_tile,
                                   k_desc, SIMILARITY, False, CANDIDATES, FEATURES, PRECISION, INJECT,
                                   PRODUCT_FEATURES)
    if MASK == 1:
        columns, largest = _seed_tiles(columns, largest, whole, end, q_ptr, k_ptr, norms_ptr, mask_rows, rows, row_ok,
                                       first_row, live, m, d, q_stride, k_stride, q_norms, row_terms, q_factors, model,
                                       absolute, factor, half_additive, similarity_constant, q_tile, k_desc,
                                       SIMILARITY, True, CANDIDATES, FEATURES, PRECISION, INJECT, PRODUCT_FEATURES)
    # The K-th largest of the columns: rounds of a row's largest, each removing every column that holds
    # it and counting them (ties: integer grids, duplicated keys), until K are counted.
    reached = tl.full([rows.shape[0]], float("-inf"), tl.float32)
    taken = tl.zeros([rows.shape[0]], tl.int32)
    round = 0
    while round < k:
        top = tl.max(columns, 1)
        holding = columns == top[:, None]
        reached = tl.where(taken < k, top, reached)
        taken += tl.sum(holding.to(tl.int32), 1)
        columns = tl.where(holding, float("-inf"), columns)
        round += 1
    return tl.where(live, tl.fma(-row_terms, largest, reached), float("-inf"))


@triton.jit
def _seeded(seeds_ptr, at, row_ok, live, threshold, top_open, similarity_constant, SIMILARITY: tl.constexpr):
    """(threshold, top_open) [ROWS] before the first tile, from the rows' seeds t0 (_seed, written by
    _seed_thresholds_kernel at seeds_ptr + at): the row's K-th exact key is at least key(t0), so the
    gate compares with the least dot product whose key reaches key(t0) (_dot_threshold), and a masked
    candidate (key -inf) can no longer enter the row's top: it closes. Rows whose t0 is -inf keep
    theirs."""
    reached = tl.where(live, tl.load(seeds_ptr + at, mask=row_ok, other=float("-inf")), float("-inf"))
    lowered = _dot_threshold(select.scaled_by_root(reached, similarity_constant, SIMILARITY), similarity_constant,
                             SIMILARITY)
    return tl.maximum(threshold, lowered), top_open & (reached == float("-inf"))


@triton.jit
def _seed_thresholds_kernel(q_ptr, k_ptr, mask_ptr, wholes_ptr, norms_ptr, seeds_ptr, n, m, d, k, mask_slice_stride,
                            slices_per_mask_slice, similarity_constant, bound_scale, heads, q_batch_stride,
                            q_head_stride, q_row_stride, k_batch_stride, k_head_stride, k_row_stride,
                            SIMILARITY: tl.constexpr,
                            MASK: tl.constexpr, ROWS: tl.constexpr, CANDIDATES: tl.constexpr,
                            FEATURES: tl.constexpr, PRECISION: tl.constexpr, PRODUCT_FEATURES: tl.constexpr,
                            INJECT: tl.constexpr = 0):
    # Grid (blocks of ROWS query rows, G): seeds [G * N] float32 gets each row's _seed over the first
    # SEED_TILES tiles its rows' true entries reach, whole tiles of M, for _bounded_select_kernel (the
    # same arguments: the keys' norms of _key_norms_kernel, a bool mask as _mask_bits_kernel's words and
    # its blocks' whole words, _tiles_whole; wholes unread without one). Its own kernel: inside the
    # select kernel, whose step holds 250-255 registers, this loop made ptxas spill.
    tl.static_assert(_tile_bound(SIMILARITY, MASK))
    g = tl.program_id(1).to(tl.int64)
    rows, row_ok, q_ptr, k_ptr, mask_rows, norms_ptr, q_norms, q_factors, vector_tiles, live, row_terms, model, \
        absolute, factor, half_additive = _block_start(q_ptr, k_ptr, mask_ptr, norms_ptr, g, tl.program_id(0), n, m,
                                                       d, mask_slice_stride, slices_per_mask_slice,
                                                       similarity_constant, bound_scale, heads,
                                                       q_batch_stride, q_head_stride, q_row_stride, k_batch_stride,
                                                       k_head_stride, k_row_stride, SIMILARITY, MASK, ROWS,
                                                       CANDIDATES, FEATURES, PRECISION)
    end = tl.minimum(_tiles_reached(mask_rows, live, m, tl.where(vector_tiles, m // CANDIDATES * CANDIDATES, 0),
                                    MASK, CANDIDATES), _SEED_TILES * CANDIDATES)
    whole = end
    if MASK == 1:
        whole = _tiles_whole(wholes_ptr, g, tl.program_id(0), tl.cdiv(n, ROWS), mask_slice_stride,
                             slices_per_mask_slice, end, CANDIDATES, 1)
    # The TMA copies of the tiles (_seed; on sm_80, where there is no TMA, Triton lowers them to loads).
    q_desc, k_desc = _tile_descriptors(q_ptr, k_ptr, n, m, d, q_row_stride, k_row_stride, vector_tiles, ROWS,
                                       CANDIDATES)
    q_tile = q_desc.load([tl.program_id(0) * ROWS, 0])
    reached = _seed(q_ptr, k_ptr, norms_ptr, mask_rows, rows, row_ok, tl.program_id(0) * ROWS, live, m, d, k,
                    q_row_stride, k_row_stride, q_norms, row_terms, q_factors, model, absolute, factor, half_additive,
                    similarity_constant, whole, end, q_tile, k_desc, SIMILARITY, MASK, CANDIDATES, FEATURES, PRECISION,
                    INJECT, PRODUCT_FEATURES)
    tl.store(seeds_ptr + g * n + rows, reached, mask=row_ok)


@triton.jit
def _bool_masked(lanes, mask_bits, first, m, live, threshold, top_open, CANDIDATES: tl.constexpr):
    """The lane words (_passing_words) of the candidates that pass with a bool mask (mask_bits:
    _mask_words), from those whose bounds pass (lanes): a false entry makes the key -inf, which enters
    the row's top only while the top has an empty slot (top_open: then every valid candidate passes,
    whatever its score; once K candidates are ranked, a -inf key of a later, higher index loses the tie
    to each of them); a true entry passes by its bound, and whatever its score while the threshold is
    -inf."""
    valid = tl.where(live[:, None], _valid_lanes(first, m, CANDIDATES // _LANES), 0)
    mask_lanes = _lanes_of(mask_bits, CANDIDATES)
    return tl.where(top_open[:, None], valid,
                    tl.where((threshold == float("-inf"))[:, None], valid & mask_lanes, lanes & mask_lanes))


@triton.jit
def _popcount(x):
    """The set bits of int32 x: popc on a GPU; SWAR under the interpreter, which has no inline PTX."""
    if _INTERPRETED:
        x = x - ((x >> 1) & 0x55555555)
        x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
        x = (x + (x >> 4)) & 0x0F0F0F0F
        return (x * 0x01010101) >> 24
    return tl.inline_asm_elementwise("popc.b32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _bit_or(a, b):
    return a | b


@triton.jit
def _passing_words(passing, CANDIDATES: tl.constexpr):
    """[ROWS, LANES] int32, the lane words of the tile or tiles passing ([ROWS, W], W = CANDIDATES or 2
    CANDIDATES): bit b of word l set where candidate SPAN l + b passes (SPAN = W / LANES), from one
    small tensor-core product of passing (bool, or a 16-bit float matrix of 1.0 and 0.0: _rounded_gate's)
    by a [W, 16] matrix whose column j weighs 8 candidates by their powers of two: the sums are integers
    below 256, exact in float32, and come in the scores' own layout (wgmma's accumulator), where the
    thread of a row's quad that holds columns 2 l, 2 l + 1, 2 l + 8 and 2 l + 9 holds word l's four
    bytes: the words are put together within each thread (no scan, no exchange between threads), and
    the appends run on a thread's own words (_appended; a 64-bit word a row, summed across the quad by
    shuffles, and each round's store converted to another layout took 21 % of the step's instructions
    at N = 16384)."""
    W: tl.constexpr = passing.shape[1]
    SPAN: tl.constexpr = W // _LANES
    tl.static_assert(CANDIDATES == 64 and (W == CANDIDATES or W == 2 * CANDIDATES))
    ones = passing
    if passing.dtype == tl.int1:
        ones = tl.where(passing, 1.0, 0.0).to(tl.float16)
    c = tl.arange(0, W)[:, None]
    byte = (c % SPAN) // 8  # of its lane word, in column 2 lane + byte % 2 + 8 (byte // 2)
    j = tl.arange(0, 16)[None, :]
    weights = tl.where(j == 2 * (c // SPAN) + byte % 2 + 8 * (byte // 2), (1 << (c % 8)).to(tl.float32), 0.0)
    words = tl.dot(ones, weights.to(ones.dtype)).to(tl.int32)  # powers of two to 2^7: exact in either dtype
    quads = tl.reshape(words << (8 * (j % 2 + 2 * (j // 8))), [passing.shape[0], 2, _LANES, 2])
    return tl.reduce(tl.reduce(quads, 3, _bit_or), 1, _bit_or)


@triton.jit
def _rounded_gate(upper, gate):
    """[ROWS, W] bfloat16 (float16 under the interpreter): 1.0 where upper rounded to bfloat16 is at least
    gate [ROWS] rounded so, else 0.0 (NaN on either side: 0.0). Rounding to nearest keeps order, so
    every pair with upper >= gate passes, and a few within half a bfloat16 step below it, which the
    exact re-score settles. PTX's set.ge.bf16x2 (sm_90: the two-tile step's only) compares two pairs at
    once and writes the words product's operands: 32 conversions and 32 compares a thread where a
    float32 compare per pair and the packing took 96 (the step 420 -> about 391 SASS a warp; not yet
    run on a GPU: its encoding of 1.0 is PTX's, checked by the next GPU check). Under the interpreter, which has no
    inline PTX, the rounded values compared in float32 (its conversion rounds toward zero: as monotone,
    so the same superset), as float16 (Triton 3.6's interpreter compares bfloat16 as their bits, and
    its bfloat16 tl.dot gave 4.5e9 for 2^16 - 1)."""
    rounded = upper.to(tl.bfloat16)
    level = tl.broadcast_to(gate.to(tl.bfloat16)[:, None], rounded.shape)
    if _INTERPRETED:
        return tl.where(rounded.to(tl.float32) >= level.to(tl.float32), 1.0, 0.0).to(tl.float16)
    return tl.inline_asm_elementwise("set.ge.bf16x2.bf16x2 $0, $1, $2;", "=r,r,r", [rounded, level],
                                     dtype=tl.bfloat16, is_pure=True, pack=2)


@triton.jit
def _lowest_bit(bits):
    """(the lowest set bit of int32 bits alone, its position): 0 and -127 where no bit is set."""
    lowest = bits & -bits
    exponent = lowest.to(tl.uint32, bitcast=True).to(tl.float32).to(tl.int32, bitcast=True) >> 23  # exact
    return lowest, exponent - 127


@triton.jit
def _stored_where_held(ptrs, values, mask):
    """tl.store(ptrs, values, mask) of int32 values, by the threads that hold them (in the appends, the
    lane words' own: each element is one thread's). tl.store took the layout that Triton gives a store
    of scattered addresses: a conversion of the addresses and one of the values through shared memory,
    four barriers, in every round of the appends. Under the interpreter (no inline PTX): tl.store."""
    if _INTERPRETED:
        tl.store(ptrs, values, mask=mask)
    else:
        tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.b32 [$1], $2; "
                                  "mov.b32 $0, 0; }", "=r,l,r,r", [ptrs.to(tl.int64), values, mask.to(tl.int32)],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _lane_counts(lanes):
    """(counts [ROWS, LANES]: each lane word's set bits, before [ROWS, LANES]: those of the row's words
    below it, total [ROWS]), from one sum across the quad: word l's count times 1 + 2^(8 (l + 1)) + ...
    + 2^24 puts the row's total in byte 0 of the sum and the count below word l in byte l (each at
    most 2 CANDIDATES: no carry)."""
    counts = _popcount(lanes)
    lane = tl.arange(0, _LANES)[None, :]
    higher = tl.where(lane == 0, 0x01010100, tl.where(lane == 1, 0x01010000, tl.where(lane == 2, 0x01000000, 0)))
    packed = tl.sum(counts * (1 + higher), 1)
    before = tl.where(lane == 0, 0, (packed[:, None] >> (8 * lane)) & 0xFF)
    return counts, before, packed & 0xFF


@triton.jit
def _appended(queue, fill, lanes, before, first, busiest, QUEUE: tl.constexpr, W: tl.constexpr):
    """The candidates first + SPAN l + b, for every bit b of each row's lane word l (lanes; before: the
    set bits of the row's words below l; SPAN = W / LANES), written to the row's queue from position
    fill on, word after word: a round per candidate of the busiest word. Each thread stores its own
    words' candidates (_stored_where_held), under a mask: a word with none left must not write into
    the next word's positions."""
    position = tl.arange(0, fill.shape[0])[:, None] * QUEUE + fill[:, None] + before  # in the program's queues
    base = first + tl.arange(0, _LANES)[None, :] * (W // _LANES)
    entry = 0
    while entry < busiest:
        lowest, bit = _lowest_bit(lanes)
        left = lowest != 0
        _stored_where_held(queue + position, base + bit, left)
        position += left.to(tl.int32)
        lanes ^= lowest
        entry += 1


def tiles_per_step(similarity, mask_kind, dtype, arch):
    """Tiles of CANDIDATES candidates the loop scores a step (the kernel's STEP_TILES) for this
    similarity (a code), mask kind, input dtype and sm_<arch>: two for dot and scaled_dot without a
    mask or with a bool mask (its whole tiles: _tiles_whole; the others one a step), in half
    precision, from sm_90 (one [ROWS, 2 CANDIDATES] product, one gate words product, one reduction of
    the queues' fill and one flush test for both: 189 instructions a warp per tile where one tile a
    step took 255, bfloat16 at K <= 8; the static bound of 12 x N, D 64, K 8: 1,662 against 1,777 us
    at N = 16384, though 228 against 214 at 4096, where the coarser flushes re-score 75 candidates per
    row against 65). One elsewhere: cosine and gaussian (their rows start at -inf, and the first step
    lets 128 candidates through, not 64: 313 and 321 us against 290 and 288 at 4096), with an
    additive mask (its entries per pair), and where ptxas spilled the wider product's accumulators
    (sm_80: 16-160 bytes; float32's 8 warps: 8-64 bytes)."""
    wide = similarity in (DOT, SCALED_DOT) and mask_kind != 2 and dtype != "float32" and arch >= 90
    return 2 if wide else 1


@triton.jit
def _row_terms(q_norms, q_squares, live, d, bound_scale, PRECISION: tl.constexpr, EXACT_PRODUCTS: tl.constexpr,
               SIMILARITY: tl.constexpr):
    """(row_terms [ROWS], model, absolute, factor, half_additive) of _upper_keys: NaN row terms for the
    rows that are not live, so that none of their pairs passes the gate. bound_scale inflates the
    bound (the tests'; 1 on every launch)."""
    model, slack, absolute = error_bound(d, EXACT_PRODUCTS, PRECISION)
    model, slack, absolute = model * bound_scale, slack * bound_scale, absolute * bound_scale
    factor, additive = gaussian_bound(d, model, absolute)
    half_additive = 0.5 * additive
    if SIMILARITY == GAUSSIAN:
        terms = tl.fma(-factor, q_squares, half_additive)
    else:
        # The bound as one multiple of |q||k|: norms are at least NORM_FLOOR, so the absolute term is at
        # most absolute / NORM_FLOOR^2 of it; the factor covers this evaluation's roundings.
        terms = (model + slack + absolute / (NORM_FLOOR * NORM_FLOOR)) * (1.0 + 2.0 ** -20) * q_norms
    return tl.where(live, terms, float("nan")), model, absolute, factor, half_additive


@triton.jit
def _tile_offsets_fit(d, q_stride, k_stride, ROWS: tl.constexpr):
    """Whether _upper_keys' 32-bit offsets hold every element it loads: ROWS query rows from the block's
    first, TILE_OFFSET_ROWS key rows from the step's first, d features each."""
    widest = tl.maximum(tl.full([], ROWS - 1, tl.int64) * q_stride,
                        tl.full([], _TILE_OFFSET_ROWS - 1, tl.int64) * k_stride)
    return widest + d <= 2**31 - 1


@triton.jit
def _block_start(q_ptr, k_ptr, mask_ptr, norms_ptr, g, block, n, m, d, mask_slice_stride, slices_per_mask_slice,
                 similarity_constant, bound_scale, heads, q_batch_stride, q_head_stride, q_row_stride, k_batch_stride,
                 k_head_stride, k_row_stride, SIMILARITY: tl.constexpr, MASK: tl.constexpr, ROWS: tl.constexpr,
                 CANDIDATES: tl.constexpr, FEATURES: tl.constexpr, PRECISION: tl.constexpr):
    """What the select and seeds kernels know of the block of ROWS query rows `block` of slice g before
    its tiles: (rows, row_ok, q_ptr and k_ptr at the slice, the mask's rows, norms_ptr at the slice's
    norms, the rows' norms, cosine's inverse norms of the rows (their sums of squares otherwise,
    unread), vector_tiles (whether the tiles' vector loads serve these rows), live, and _row_terms'
    (row_terms, model, absolute, factor, half_additive))."""
    rows = block * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n
    q_ptr += row_chunks.slice_starts(g, heads, q_batch_stride, q_head_stride)
    k_ptr += row_chunks.slice_starts(g, heads, k_batch_stride, k_head_stride)
    # The rows of the mask (unread without one): a bool mask's words (_mask_bits_kernel), an additive one's entries.
    mask_row_stride = m
    if MASK == 1:
        mask_row_stride = tl.cdiv(m, CANDIDATES) + 1
    mask_rows = (mask_ptr + select.mask_slice_start(g, mask_slice_stride, slices_per_mask_slice)
                 + rows.to(tl.int64)[:, None] * mask_row_stride)
    q_norms, q_squares = _row_norms(q_ptr, rows, row_ok, d, q_row_stride, ROWS, FEATURES)
    q_factors = q_squares  # unread but by cosine: its inverse norms of the rows, as select._row_factors's
    if SIMILARITY == COSINE:
        q_factors = select.inverse_of_norms(q_squares, similarity_constant)
    norms_ptr += g * _NORM_SECTIONS * (m + 1)
    # The tiles' vector loads need rows of whole chunks on 16-byte boundaries and offsets within a block
    # and a step that fit 32 bits (the launcher takes this kernel only then); else every row goes to the
    # rerun, and no tile is scored.
    vector_tiles = (select._whole_chunks(q_ptr, k_ptr, d, q_row_stride, k_row_stride, FEATURES)
                    & _tile_offsets_fit(d, q_row_stride, k_row_stride, ROWS))
    # Rows whose keys could be NaN or +inf, or whose bounds could overflow, go to the rerun (all of the
    # slice's where a key's norm is so); the others are live, and only their pairs can pass the gate.
    live = (row_ok & (q_norms <= NORM_CEILING) & (tl.load(norms_ptr + m + tl.zeros([ROWS], tl.int32)) == 0.0)
            & vector_tiles)
    # (d as the block's: the bound's scalars are then made per block, not held from the kernel's start
    # through every block, which cost the select kernel's step a register spilled.)
    row_terms, model, absolute, factor, half_additive = _row_terms(q_norms, q_squares, live, tl.where(block < 0, 0, d),
                                                                   bound_scale, PRECISION,
                                                                   q_ptr.dtype.element_ty != tl.float32, SIMILARITY)
    return (rows, row_ok, q_ptr, k_ptr, mask_rows, norms_ptr, q_norms, q_factors, vector_tiles, live, row_terms, model,
            absolute, factor, half_additive)


@triton.jit
def _tiles_reached(mask_rows, live, m, limit, MASK: tl.constexpr, CANDIDATES: tl.constexpr):
    """The end of the tiles the block's rows' true entries reach (a bool mask's: _mask_bits_kernel's
    last column; a causal mask's block: its diagonal tile), at most limit; limit without one."""
    reach = limit
    if MASK == 1:
        words_reached = tl.load(mask_rows + tl.cdiv(m, CANDIDATES), mask=live[:, None], other=0)
        reach = tl.minimum(limit, (tl.max(tl.max(words_reached, 1), 0) * CANDIDATES).to(tl.int32))
    return reach


@triton.jit
def _tiles_whole(wholes_ptr, g, block, blocks, mask_slice_stride, slices_per_mask_slice, limit,
                 CANDIDATES: tl.constexpr, STEP_TILES: tl.constexpr):
    """The end of the steps of STEP_TILES tiles from the first in which a bool mask holds every
    candidate for every row of the block `block` of slice g (wholes: _mask_bits_kernel's, a mask
    slice's blocks, or one set for a shared mask), at most limit (a multiple of CANDIDATES or M). One
    value a block, made by the words kernel: read from the rows' words here, the reduction made ptxas
    spill."""
    mask_slice = tl.where(mask_slice_stride == 0, 0, g.to(tl.int32) // slices_per_mask_slice)
    whole_words = tl.load(wholes_ptr + mask_slice.to(tl.int64) * blocks + block)
    whole_words = tl.minimum(whole_words, limit // CANDIDATES)
    return whole_words // STEP_TILES * (STEP_TILES * CANDIDATES)


@triton.jit
def _resumed(indices_ptr, redo_ptr, g, n, k, top, unrankable, threshold, top_open, rows, row_ok, m,
             similarity_constant, SIMILARITY: tl.constexpr, SLOTS: tl.constexpr):
    """(top, unrankable, threshold, top_open) of part 2 of a bool mask's select before its first tile:
    part 1's rerun flags, and of the rows it settled their exact top (the packed keys of its first K
    slots, which it wrote in place of the indices; the slots past K empty, below them: only K count),
    the threshold the larger of the seeded one and the K-th key's, the top open only where both leave
    it so."""
    slots = tl.arange(0, SLOTS)
    unrankable |= tl.load(redo_ptr + g * n + rows, mask=row_ok, other=0)
    kept = (row_ok & (unrankable == 0))[:, None] & (slots[None, :] < k)  # part 1 wrote the settled rows'
    top = tl.where(kept, tl.load(indices_ptr + (g * n + rows)[:, None] * k + slots[None, :], mask=kept, other=0),
                   top)
    kth_key, kth_index = select._unpacked(tl.min(tl.where(slots[None, :] < k, top, select.GREATEST_KEY), 1))
    threshold = tl.maximum(threshold, _dot_threshold(kth_key, similarity_constant, SIMILARITY))
    return top, unrankable, threshold, top_open & (kth_index > m)  # an empty slot's index is above M


@triton.jit
def _unmasked_step(q_ptr, k_ptr, norms_ptr, rows, row_ok, first_row, first, threshold, m, d, q_stride, k_stride,
                   q_norms, row_terms, q_factors, model, absolute, factor, half_additive, similarity_constant,
                   SIMILARITY: tl.constexpr, CANDIDATES: tl.constexpr, FEATURES: tl.constexpr,
                   PRECISION: tl.constexpr, INJECT: tl.constexpr, TILE_BOUND: tl.constexpr,
                   STEP_TILES: tl.constexpr, WHOLE: tl.constexpr, q_tile, q_desc, k_desc):
    """The lane words (_passing_words) of the STEP_TILES tiles from candidate `first`, where
    no mask removes a candidate of a live row (no mask; a bool mask's whole tiles): the bounds
    (_upper_keys) against the gate (_gate_thresholds), the candidates past M dropped (TILE_BOUND;
    counted: harmless) unless WHOLE (a bool mask's whole tiles: none is). The two-tile step (sm_90)
    takes its products from TMA copies (q_tile, q_desc and k_desc: _tile_descriptors; None for one
    tile a step) and compares by bfloat16 pairs (_rounded_gate)."""
    cand = first + tl.arange(0, STEP_TILES * CANDIDATES)
    # The tiles' largest key norm before the products, so that its load's latency hides behind theirs
    # (read after them, it was a memory round trip of its own in every step).
    largest = _largest_key_norm(norms_ptr, first, m, TILE_BOUND, CANDIDATES, STEP_TILES)
    upper = _upper_keys(q_ptr, k_ptr, norms_ptr, rows, row_ok, cand, cand < m, first_row, first, m, d, q_stride,
                        k_stride, q_norms, row_terms, q_factors, model, absolute, factor, half_additive,
                        similarity_constant, SIMILARITY, FEATURES, PRECISION, INJECT, TILE_BOUND, FEATURES, q_tile,
                        q_desc, k_desc)
    gate = _gate_thresholds(threshold, row_terms, largest, TILE_BOUND)
    if STEP_TILES == 2:  # sm_90 (tiles_per_step)
        lanes = _passing_words(_rounded_gate(upper, gate), CANDIDATES)
    else:
        lanes = _passing_words(upper >= gate[:, None], CANDIDATES)
    if TILE_BOUND and not WHOLE:  # not the last tile's candidates past M (row M - 1's products)
        lanes &= _valid_lanes(first, m, STEP_TILES * CANDIDATES // _LANES)
    return lanes


@triton.jit
def _advanced(q_ptr, k_ptr, norms_ptr, mask_rows, queue, fill, lanes, first, top, unrankable, rescored, threshold,
              top_open, open_rows, rows, live, q_factors, m, d, k, q_stride, k_stride, similarity_constant,
              SIMILARITY: tl.constexpr, MASK: tl.constexpr, ROWS: tl.constexpr, SLOTS: tl.constexpr,
              QUEUE: tl.constexpr, FLUSH: tl.constexpr, CANDIDATES: tl.constexpr, STEP_TILES: tl.constexpr):
    """The end of a step: its passing candidates (lanes: _passing_words) appended to the rows' queues,
    which are flushed once one holds FLUSH_AT or more (the threshold rises early), so that a queue holds
    at most FLUSH_AT - 1 + a step's candidates, below QUEUE. Returns (fill, top, unrankable, rescored,
    threshold, top_open, open_rows: a bool mask's live rows with an empty slot, any)."""
    # The fullest queue after the step and the step's busiest word, from one reduction.
    counts, before, total = _lane_counts(lanes)
    fill_before = fill
    fill += total
    fullest, busiest = tl.split(tl.max(tl.max(tl.join(tl.broadcast_to(fill[:, None], counts.shape), counts), 1), 0))
    _appended(queue, fill_before, lanes, before, first, busiest, QUEUE, STEP_TILES * CANDIDATES)
    if fullest >= QUEUE - 2 * CANDIDATES:
        rescored += fill
        top, unrankable, kth_key, top_open = _flushed(q_ptr, k_ptr, norms_ptr, mask_rows, queue, fill, top,
                                                      unrankable, rows, live, q_factors, m, d, k, q_stride, k_stride,
                                                      similarity_constant, SIMILARITY, MASK, ROWS, SLOTS, QUEUE,
                                                      FLUSH, CANDIDATES)
        threshold = kth_key if MASK == 2 else _dot_threshold(kth_key, similarity_constant, SIMILARITY)
        fill = tl.zeros([ROWS], dtype=tl.int32)
        if MASK == 1:
            open_rows = tl.max((top_open & live).to(tl.int32), 0)
    return fill, top, unrankable, rescored, threshold, top_open, open_rows


@triton.jit
def _select_block(q_ptr, k_ptr, mask_ptr, wholes_ptr, scores_ptr, indices_ptr, redo_ptr, rescored_ptr, norms_ptr,
                  seeds_ptr, queue, g, block, slices, n, m, d, k, mask_slice_stride, slices_per_mask_slice,
                  similarity_constant, bound_scale, dtype_code, heads, q_batch_stride, q_head_stride, q_row_stride,
                  k_batch_stride, k_head_stride, k_row_stride, SIMILARITY: tl.constexpr, MASK: tl.constexpr,
                  ROWS: tl.constexpr, CANDIDATES: tl.constexpr, SLOTS: tl.constexpr, QUEUE: tl.constexpr,
                  FLUSH: tl.constexpr, FEATURES: tl.constexpr, PRECISION: tl.constexpr, INJECT: tl.constexpr,
                  STATS: tl.constexpr, STEP_TILES: tl.constexpr, PART: tl.constexpr):
    """The kernel's work on the block of ROWS query rows `block` of slice g (the module's text)."""
    # The mask as the steps and flushes see it (a bool mask's whole tiles, part 1: none), and the tiles a
    # step (a bool mask's: one; the others: STEP_TILES).
    STEP_MASK: tl.constexpr = 0 if PART == 1 else MASK
    LOOP_TILES: tl.constexpr = 1 if STEP_MASK == 1 else STEP_TILES
    rows, row_ok, q_ptr, k_ptr, mask_rows, norms_ptr, q_norms, q_factors, vector_tiles, live, row_terms, model, \
        absolute, factor, half_additive = _block_start(q_ptr, k_ptr, mask_ptr, norms_ptr, g, block, n, m, d,
                                                       mask_slice_stride, slices_per_mask_slice,
                                                       similarity_constant, bound_scale, heads,
                                                       q_batch_stride, q_head_stride, q_row_stride, k_batch_stride,
                                                       k_head_stride, k_row_stride, SIMILARITY, MASK, ROWS,
                                                       CANDIDATES, FEATURES, PRECISION)
    unrankable = (row_ok & ~live).to(tl.int32)
    TILE_BOUND: tl.constexpr = _tile_bound(SIMILARITY, MASK)

    kth_key = tl.full([ROWS], float("-inf"), tl.float32)
    threshold = kth_key  # what the gate compares with: the K-th key, or its _dot_threshold
    top_open = kth_key == kth_key  # the top has an empty slot: a -inf key (a masked candidate) can enter
    if TILE_BOUND:  # the rows' seeds (_seed_thresholds_kernel)
        threshold, top_open = _seeded(seeds_ptr, g * n + rows, row_ok, live, threshold, top_open,
                                      similarity_constant, SIMILARITY)
    # Each row's exact top: SLOTS packed keys, descending; empty slots hold -inf with indices m + 1,
    # m + 2, ... (below every candidate, a masked one included).
    slots = tl.arange(0, SLOTS)
    top = select._packed(tl.full([ROWS, SLOTS], float("-inf"), tl.float32),
                         m + 1 + slots[None, :] + tl.zeros([ROWS, SLOTS], tl.int32))
    fill = tl.zeros([ROWS], dtype=tl.int32)
    rescored = tl.zeros([ROWS], dtype=tl.int32)  # candidates re-scored exactly (STATS)
    scored = 0  # tiles scored (STATS)
    visited = 0  # tiles the loop took, scored or not (STATS)
    first = 0
    limit = tl.where(vector_tiles, m, 0)
    if PART != 0:
        # A bool mask's tiles in which it holds every candidate for every row of the block (a causal mask's
        # left of the block's diagonal), in whole steps: there the mask changes nothing, so part 1 scores
        # them as without one, STEP_TILES a step; part 2 takes the others one a step, from part 1's
        # selection.
        whole = _tiles_whole(wholes_ptr, g, block, tl.cdiv(n, ROWS), mask_slice_stride, slices_per_mask_slice,
                             limit, CANDIDATES, STEP_TILES)
        if PART == 1:
            limit = whole
        else:
            first = whole
            top, unrankable, threshold, top_open = _resumed(indices_ptr, redo_ptr, g, n, k, top, unrankable,
                                                            threshold, top_open, rows, row_ok, m,
                                                            similarity_constant, SIMILARITY, SLOTS)
    # The two-tile step's TMA copies: the block's queries once, here (none for one tile a step).
    q_tile = None
    q_desc = None
    k_desc = None
    if LOOP_TILES == 2:
        q_desc, k_desc = _tile_descriptors(q_ptr, k_ptr, n, m, d, q_row_stride, k_row_stride, vector_tiles, ROWS,
                                           LOOP_TILES * CANDIDATES)
        q_tile = q_desc.load([block * ROWS, 0])
    # With a bool mask, the tiles past every live row's last true entry: none decides, and each queues
    # only where a live row's top has an empty slot (_bool_masked). So the loop ends at the last tile
    # the rows' words reach (_mask_bits_kernel's last column; a causal mask's block: its diagonal tile),
    # or later while some live row's top has an empty slot (a flush closes it: every tile queues M's
    # next candidates in such a row, M >= K). Without one, every tile.
    reach = limit
    open_rows = tl.full([], 1, tl.int32)
    if STEP_MASK == 1:
        reach = _tiles_reached(mask_rows, live, m, limit, STEP_MASK, CANDIDATES)
        open_rows = tl.max((top_open & live).to(tl.int32), 0)
    while (first < limit) & ((first < reach) | (open_rows != 0)):
        cand = first + tl.arange(0, LOOP_TILES * CANDIDATES)
        cand_ok = cand < m
        if STEP_MASK == 1:
            # A row's bounds decide only where the mask holds a candidate and the row's threshold is above
            # -inf (_bool_masked): a tile where no row's do is not scored (a causal mask's tiles past the
            # block's last row, a padding mask's padded keys), which appends what scoring it would.
            mask_bits = _mask_words(mask_rows, first, live, CANDIDATES)
            deciding = tl.max(((mask_bits != 0) & (threshold > float("-inf"))).to(tl.int32), 0)
            lanes = tl.zeros([ROWS, _LANES], tl.int32)
            if deciding != 0:
                upper = _upper_keys(q_ptr, k_ptr, norms_ptr, rows, row_ok, cand, cand_ok, block * ROWS, first, m, d,
                                    q_row_stride, k_row_stride, q_norms, row_terms, q_factors, model, absolute,
                                    factor, half_additive, similarity_constant, SIMILARITY, FEATURES, PRECISION,
                                    INJECT, TILE_BOUND, 2 * FEATURES if SLOTS <= 8 else FEATURES)
                gate = _gate_thresholds(threshold, row_terms,
                                        _largest_key_norm(norms_ptr, first, m, TILE_BOUND, CANDIDATES, 1),
                                        TILE_BOUND)
                lanes = _passing_words(upper >= gate[:, None], CANDIDATES)
                scored += 1
            lanes = _bool_masked(lanes, mask_bits, first, m, live, threshold, top_open, CANDIDATES)
        elif STEP_MASK == 2:
            upper = _upper_keys(q_ptr, k_ptr, norms_ptr, rows, row_ok, cand, cand_ok, block * ROWS, first, m, d,
                                q_row_stride, k_row_stride, q_norms, row_terms, q_factors, model, absolute, factor,
                                half_additive, similarity_constant, SIMILARITY, FEATURES, PRECISION, INJECT,
                                TILE_BOUND, FEATURES)
            if STATS:
                scored += 1
            both_ok = live[:, None] & cand_ok[None, :]
            gate = select._masked(select.scaled_by_root(upper, similarity_constant, SIMILARITY),
                                  mask_rows + cand[None, :], both_ok, MASK)
            unrankable |= tl.max(select._unrankable(gate, both_ok), 1)  # a NaN or +inf mask entry
            # A -inf key (a -inf mask entry) enters only while the top has an empty slot (_bool_masked).
            lanes = _passing_words((gate >= threshold[:, None]) & ((gate > float("-inf")) | top_open[:, None]),
                                   CANDIDATES)
        else:
            lanes = _unmasked_step(q_ptr, k_ptr, norms_ptr, rows, row_ok, block * ROWS, first, threshold, m, d,
                                   q_row_stride, k_row_stride, q_norms, row_terms, q_factors, model, absolute, factor,
                                   half_additive, similarity_constant, SIMILARITY, CANDIDATES, FEATURES, PRECISION,
                                   INJECT, TILE_BOUND, STEP_TILES, PART == 1, q_tile, q_desc, k_desc)
            if STATS:
                scored += tl.minimum(tl.cdiv(m - first, CANDIDATES), STEP_TILES)
        fill, top, unrankable, rescored, threshold, top_open, open_rows = _advanced(
            q_ptr, k_ptr, norms_ptr, mask_rows, queue, fill, lanes, first, top, unrankable,
            rescored, threshold, top_open, open_rows, rows, live, q_factors, m, d, k, q_row_stride, k_row_stride,
            similarity_constant, SIMILARITY, STEP_MASK, ROWS, SLOTS, QUEUE, FLUSH, CANDIDATES, LOOP_TILES)
        first += LOOP_TILES * CANDIDATES
        if STATS:
            visited += tl.minimum(tl.cdiv(m - first + LOOP_TILES * CANDIDATES, CANDIDATES), LOOP_TILES)
    top, unrankable, _, _ = _flushed(q_ptr, k_ptr, norms_ptr, mask_rows, queue, fill, top, unrankable, rows, live,
                                     q_factors, m, d, k, q_row_stride, k_row_stride, similarity_constant, SIMILARITY,
                                     STEP_MASK, ROWS, SLOTS, QUEUE, FLUSH, CANDIDATES)
    if STATS:  # rescored_ptr: int32 [3, slices * N]; part 2 adds to part 1's
        rescored += fill
        counts = rescored_ptr + g * n + rows
        if PART == 2:
            rescored += tl.load(counts, mask=row_ok, other=0)
            scored += tl.load(counts + n * slices, mask=row_ok, other=0)
            visited += tl.load(counts + 2 * n * slices, mask=row_ok, other=0)
        tl.store(counts, rescored, mask=row_ok)
        tl.store(counts + n * slices, scored + tl.zeros([ROWS], tl.int32), mask=row_ok)
        tl.store(counts + 2 * n * slices, visited + tl.zeros([ROWS], tl.int32), mask=row_ok)

    settled = unrankable == 0
    best_keys, best_index = select._unpacked(top)
    out = (g * n + rows)[:, None] * k + slots[None, :]
    if PART == 1:  # the settled rows' exact tops so far, as packed keys (_resumed reads them), and the flags
        tl.store(indices_ptr + out, top, mask=(row_ok & settled)[:, None] & (slots[None, :] < k))
        tl.store(redo_ptr + g * n + rows, tl.where(settled, 0, 1), mask=row_ok)
    else:
        written = (row_ok & settled)[:, None] & (slots[None, :] < k)
        # The indices before the scores: stored after store_as's branches, Triton 3.6 reused a layout
        # conversion of `written` made inside one of them ("operand does not dominate this use", sm_90).
        tl.store(indices_ptr + out, best_index.to(tl.int64), mask=written)
        tl.store(redo_ptr + g * n + rows, tl.where(settled, 0, 1), mask=row_ok)
        select.store_as(scores_ptr, out, select._reported_scores(best_keys, unrankable, SIMILARITY), written,
                        dtype_code)


@triton.jit
def _bounded_select_kernel(q_ptr, k_ptr, mask_ptr, wholes_ptr, scores_ptr, indices_ptr, redo_ptr, rescored_ptr,
                           norms_ptr, seeds_ptr, queue_ptr, slices, n, m, d, k, mask_slice_stride,
                           slices_per_mask_slice, similarity_constant, bound_scale, dtype_code, heads,
                           q_batch_stride, q_head_stride, q_row_stride, k_batch_stride, k_head_stride, k_row_stride,
                           SIMILARITY: tl.constexpr, MASK: tl.constexpr,
                           ROWS: tl.constexpr, CANDIDATES: tl.constexpr, SLOTS: tl.constexpr, QUEUE: tl.constexpr,
                           FLUSH: tl.constexpr, FEATURES: tl.constexpr, PRECISION: tl.constexpr,
                           STEP_TILES: tl.constexpr, PART: tl.constexpr = 0, INJECT: tl.constexpr = 0,
                           STATS: tl.constexpr = False):
    # A persistent grid: program p takes the blocks of ROWS query rows p, p + programs, ... of the
    # slices' blocks in turn, with its own queue (queue_ptr: int32 [programs * ROWS, QUEUE], scratch).
    # The settled rows' scores and indices are written as select._select_kernel writes them (slots
    # by descending key, contiguous [G, N, K], the scores in the op's dtype); redo [G * N] int32
    # gets 1 for the rows left to the rerun, 0 for the others. bound_scale: 1 on every launch. A bool
    # mask comes as _mask_bits_kernel's words (mask_slice_stride: N * (words + 1), or 0 for a shared mask;
    # a mask slice serves slices_per_mask_slice query slices: select.mask_slice_start)
    # and its blocks' whole words (wholes; any int32 pointer, unread, without a bool mask), an additive
    # one in float32 ([G, N, M] or [N, M]). A bool mask takes two launches: PART 1, then PART 2 (PART 0
    # without one). seeds [G * N] float32: _seed_thresholds_kernel's, read where _tile_bound (any
    # float32 pointer otherwise). STEP_TILES: tiles_per_step's.
    tl.static_assert((STEP_TILES == 1) or ((STEP_TILES == 2) and (MASK != 2)))
    tl.static_assert((PART == 0 and MASK != 1) or (PART != 0 and MASK == 1))  # a bool mask's: parts 1 and 2
    tl.static_assert((SIMILARITY == DOT) | (SIMILARITY == SCALED_DOT) | (SIMILARITY == COSINE)
                     | (SIMILARITY == GAUSSIAN))
    tl.static_assert((QUEUE > 2 * CANDIDATES) & (QUEUE % FLUSH == 0) & (SLOTS >= FLUSH))
    blocks = tl.cdiv(n, ROWS)
    queue = queue_ptr + tl.program_id(0).to(tl.int64) * (ROWS * QUEUE)  # the program's queues, a row's after another
    work = tl.program_id(0)
    while work < blocks * slices:
        _select_block(q_ptr, k_ptr, mask_ptr, wholes_ptr, scores_ptr, indices_ptr, redo_ptr, rescored_ptr, norms_ptr,
                      seeds_ptr, queue, (work // blocks).to(tl.int64), work % blocks, slices, n, m, d, k,
                      mask_slice_stride, slices_per_mask_slice, similarity_constant, bound_scale, dtype_code, heads,
                      q_batch_stride, q_head_stride, q_row_stride, k_batch_stride, k_head_stride, k_row_stride,
                      SIMILARITY, MASK, ROWS, CANDIDATES, SLOTS, QUEUE, FLUSH, FEATURES, PRECISION, INJECT, STATS,
                      STEP_TILES, PART)
        work += tl.num_programs(0)


@triton.jit
def _rerun_kernel(q_ptr, k_ptr, mask_ptr, scores_ptr, indices_ptr, redo_ptr, n, m, d, k, mask_slice_stride,
                  slices_per_mask_slice, similarity_constant, dtype_code, heads, q_batch_stride, q_head_stride,
                  q_row_stride, k_batch_stride, k_head_stride, k_row_stride, SIMILARITY: tl.constexpr,
                  MASK: tl.constexpr, ROWS: tl.constexpr,
                  CANDIDATES: tl.constexpr, SLOTS: tl.constexpr, FEATURES: tl.constexpr,
                  SHARED_SET: tl.constexpr = False):
    # select._select_kernel on the rows whose redo flag is set; a program with none returns at once.
    block = tl.program_id(0)
    g = tl.program_id(1).to(tl.int64)
    rows = block * ROWS + tl.arange(0, ROWS)
    flagged = tl.load(redo_ptr + g * n + rows, mask=rows < n, other=0) != 0
    if tl.max(flagged.to(tl.int32), 0) != 0:
        select.select_rows(q_ptr, k_ptr, mask_ptr, scores_ptr, indices_ptr, g, rows, flagged, n, m, d, k,
                           mask_slice_stride, slices_per_mask_slice, similarity_constant, dtype_code, heads,
                           q_batch_stride, q_head_stride, q_row_stride, k_batch_stride, k_head_stride, k_row_stride,
                           SIMILARITY, MASK, ROWS, CANDIDATES, SLOTS, FEATURES, SHARED_SET)
