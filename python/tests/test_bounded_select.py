"""knn_select's tensor-core kernel with an exact re-rank (python/convnn/_triton/bounded_select.py,
issue 41), proven without a GPU under Triton's CPU interpreter (TRITON_INTERPRET=1; ctest's
python.triton_bounded_select):

- the score error bound (bounded_select.error_bound, docs/operator.md "Scores on tensor cores")
  holds against float64 for every realisation of its arithmetic model that these tests emulate
  (inputs truncated or rounded to TF32 or split in two, products summed in float32 in several orders,
  rounded to nearest or truncated), on random and adversarial inputs;
- whatever errors up to the bound the scores carry (the interpreter's tl.dot ignores the precision,
  so the kernel's test mode injects them, of either sign, adversarially at the K-th boundary, with the
  bound inflated so that many rows sit within it), the tensor-core kernel and its rerun of the rows
  it leaves give select.py's IEEE kernel's indices and scores exactly: ties, +0 and -0, masks, rows
  with fewer valid candidates than K, NaN and Inf rows, norms that overflow.

The inputs of the kernel comparisons are dyadic with few bits, so that every dot product is exact in
float32 whatever the order of its additions (numpy's matmul, the interpreter's tl.dot, against the
FMA chain of the re-rank): bitwise equality is then what the arithmetic guarantees.
"""
import os

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if INTERPRETED:
    os.environ["CONVNN_DEVICE_VALUE_CHECKS"] = "0"
if not INTERPRETED and not torch.cuda.is_available():
    pytest.skip("run with TRITON_INTERPRET=1 in the environment (ctest: python.triton_bounded_select), "
                "or on a CUDA device", allow_module_level=True)
DEVICE = torch.device("cpu") if INTERPRETED else torch.device("cuda", torch.cuda.current_device())

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from convnn._triton import bounded_select, register, select  # noqa: E402

# The tests launch the kernels themselves, not through the launchers: on a GPU, the seeds kernel's and the
# two-tile step's TMA descriptors need Triton's scratch memory, which the launchers would give.
register.with_scratch_memory()

if INTERPRETED:
    import triton_interpreter  # noqa: E402  (beside this file)

    triton_interpreter.round_bfloat16_to_nearest_even()
    triton_interpreter.multiply_bfloat16_as_numbers()

DOT, SCALED_DOT, COSINE, GAUSSIAN = (select.SIMILARITY_CODES[name] for name in ("dot", "scaled_dot", "cosine",
                                                                                   "gaussian"))


@triton.jit
def _bound_probe(d, out_ptr, EXACT_PRODUCTS: tl.constexpr, PRECISION: tl.constexpr):
    model, slack, absolute = bounded_select.error_bound(d, EXACT_PRODUCTS, PRECISION)
    factor, additive = bounded_select.gaussian_bound(d, model, absolute)
    tl.store(out_ptr, model)
    tl.store(out_ptr + 1, slack)
    tl.store(out_ptr + 2, absolute)
    tl.store(out_ptr + 3, factor)
    tl.store(out_ptr + 4, additive)


def kernel_bounds(d, exact_products, precision):
    """(model, slack, absolute, gaussian's factor, gaussian's additive) as the kernel computes them
    (float32)."""
    out = torch.zeros(5, device=DEVICE)
    _bound_probe[(1,)](d, out, EXACT_PRODUCTS=exact_products, PRECISION=precision)
    return [float(x) for x in out.cpu()]


def kernel_bound(d, exact_products, precision):
    """(model, slack, absolute) as the kernel computes them (float32)."""
    return kernel_bounds(d, exact_products, precision)[:3]


# --- the arithmetic model, emulated in float64 -------------------------------------------------------

def _tf32(x, rounding):
    """float32 x cut to TF32's 10 fraction bits, truncated or rounded to nearest (ties away)."""
    bits = x.contiguous().view(torch.int32)
    if rounding == "nearest":
        bits = bits + 0x1000
    return (bits & ~0x1FFF).view(torch.float32)


def _terms(x, y, precision, rounding):
    """[P, T] float64 products the tensor core sums for rows x, y [P, d] (float32 or half)."""
    if precision == "exact":
        return x.double() * y.double()
    if precision == "tf32":
        return _tf32(x, rounding).double() * _tf32(y, rounding).double()
    x_hi, y_hi = _tf32(x, rounding), _tf32(y, rounding)
    x_lo, y_lo = _tf32(x - x_hi, rounding), _tf32(y - y_hi, rounding)
    return torch.cat([x_hi.double() * y_hi.double(), x_hi.double() * y_lo.double(),
                      x_lo.double() * y_hi.double()], dim=1)


def _to_float32(s, rounding):
    """float64 s to float32, to nearest or toward zero."""
    near = s.float()
    if rounding == "nearest":
        return near
    too_far = near.double().abs() > s.abs()
    return torch.where(too_far, torch.nextafter(near, torch.zeros_like(near)), near)


def _float32_sum(terms, order, rounding):
    """A float32 sum of the columns of terms [P, T] in the given order, each addition rounded."""
    columns = list(range(terms.shape[1]))
    if order == "reversed":
        columns.reverse()
    elif order == "shuffled":
        columns = torch.randperm(len(columns), generator=torch.Generator().manual_seed(5)).tolist()
    if order == "pairwise":
        parts = [_to_float32(terms[:, c], rounding) for c in columns]
        while len(parts) > 1:
            parts = [_to_float32(parts[i].double() + parts[i + 1].double(), rounding) if i + 1 < len(parts)
                     else parts[i] for i in range(0, len(parts), 2)]
        return parts[0]
    acc = torch.zeros(terms.shape[0], dtype=torch.float32)
    for c in columns:
        acc = _to_float32(acc.double() + terms[:, c], rounding)
    return acc


def _ieee(x, y):
    """The IEEE kernel's dot products: an FMA chain in feature order, from +0."""
    return _float32_sum(x.double() * y.double(), "in order", "nearest")


def _norms(x):
    return (x.float() ** 2).sum(1).sqrt().clamp_min(2.0 ** -60)


def bound_inputs(case, d, dtype, pairs=256):
    """Rows x, y [pairs, d] of one kind:
    - "gaussian": N(0, 1);
    - "cancelling": a large +-2^20 pair per row that cancels, beside small terms: the sum is tiny
      against the sum of magnitudes, where a relative bound on the result would fail;
    - "all ones mantissas": every value (2 - 2^-23) * 2^e, the worst for truncation to TF32;
    - "one sign": every product positive, equal magnitudes: the accumulation's worst;
    - "subnormal and huge": values from 2^-140 to 2^40 mixed."""
    generator = torch.Generator().manual_seed(BOUND_CASES.index(case) * 10000 + d)
    x = torch.randn(pairs, d, generator=generator)
    y = torch.randn(pairs, d, generator=generator)
    if case == "cancelling":
        x[:, 0], y[:, 0] = 2.0 ** 20, 2.0 ** 20
        x[:, 1], y[:, 1] = -(2.0 ** 20), 2.0 ** 20
    elif case == "all ones mantissas":
        exponents = torch.randint(-8, 8, (2, pairs, d), generator=generator).float()
        signs = torch.randint(0, 2, (2, pairs, d), generator=generator).float() * 2 - 1
        x, y = (signs * (2.0 - 2.0 ** -23) * torch.pow(2.0, exponents)).unbind(0)
    elif case == "one sign":
        x = torch.full((pairs, d), 1.0 + 2.0 ** -7 + 2.0 ** -20)  # bfloat16: 1 + 2^-7
        y = torch.full((pairs, d), 1.0 + 2.0 ** -7 + 2.0 ** -22)
    elif case == "subnormal and huge":
        exponents = torch.randint(-140, 40, (2, pairs, d), generator=generator).float()
        x, y = (torch.randn(2, pairs, d, generator=generator) * torch.pow(2.0, exponents)).unbind(0)
    return x.to(dtype), y.to(dtype)


BOUND_CASES = ["gaussian", "cancelling", "all ones mantissas", "one sign", "subnormal and huge"]


@pytest.mark.parametrize("precision", ["exact", "tf32", "tf32x3"])
@pytest.mark.parametrize("case", BOUND_CASES)
def test_the_score_error_bound_holds_against_float64_for_every_emulated_realisation(case, precision):
    """|s - s_ieee| <= model |x| |y| + absolute (the kernel's constants), and the float32 upper bound
    the kernel forms from s is at least s_ieee, for s from every emulated tensor-core arithmetic:
    inputs truncated or rounded to TF32 (or bfloat16 inputs, whose products are exact), the terms
    summed in float32 in order, reversed, shuffled or pairwise, each addition rounded to nearest or
    truncated; D from 16 to 4096. The bound is also not loose beyond reason: within 2^12 of the worst
    error seen on the one-sign inputs (where the errors pile up)."""
    dtype = torch.bfloat16 if precision == "exact" else torch.float32
    worst_ratio = 0.0
    for d in (16, 64, 4096):
        x, y = bound_inputs(case, d, dtype, pairs=64 if d == 4096 else 256)
        model, slack, absolute = kernel_bound(d, precision == "exact", "tf32x3" if precision == "exact" else precision)
        ieee = _ieee(x, y).double()
        products = _norms(x) * _norms(y)  # float32, as the kernel
        bound = model * products.double() + absolute
        finite = torch.isfinite(products)
        for rounding in ("truncated", "nearest"):
            terms = _terms(x, y, precision, rounding)
            for order in ("in order", "reversed", "shuffled", "pairwise"):
                s = _float32_sum(terms, order, rounding)
                error = (s.double() - ieee).abs()
                assert (error[finite] <= bound[finite]).all(), (d, rounding, order, (error / bound).max())
                upper = s + ((model + slack) * products + absolute)  # float32, as the kernel
                assert (upper.double()[finite] >= ieee[finite]).all(), (d, rounding, order)
                worst_ratio = max(worst_ratio, float((error[finite] / bound[finite]).max()))
    if case == "one sign":
        assert worst_ratio > 2.0 ** -12, worst_ratio


def _sums_of_squared(x):
    """float64 values of float32 FMA chains over the columns of x [P, T] in order, from +0: each step's
    exact value rounded once (emulated: rounded to float64, then to float32; a double rounding can move
    the result by an ulp, far inside the bound's margin)."""
    acc = torch.zeros(x.shape[0], dtype=torch.float64)
    for c in range(x.shape[1]):
        acc = (acc + x[:, c].double() ** 2).float().double()
    return acc


def _fma(a, b, c):
    """float32 fma(a, b, c) of float32 tensors (emulated as _sums_of_squared)."""
    return (a.double() * b.double() + c.double()).float()


def gaussian_inputs(case, d, dtype, pairs=256):
    """bound_inputs' rows, and "near duplicates": rows far from the origin (about 100 per feature)
    that differ by 2^-10, where |q|^2 + |k|^2 - 2 q.k cancels to about 2^-20 of its terms."""
    if case != "near duplicates":
        return bound_inputs(case, d, dtype, pairs)
    generator = torch.Generator().manual_seed(7 * d)
    x = torch.randn(pairs, d, generator=generator) + 100.0
    y = x + 2.0 ** -10 * torch.randn(pairs, d, generator=generator)
    return x.to(dtype), y.to(dtype)


@pytest.mark.parametrize("precision", ["exact", "tf32", "tf32x3"])
@pytest.mark.parametrize("case", BOUND_CASES + ["near duplicates"])
def test_the_gaussian_bound_holds_against_float64_for_every_emulated_realisation(case, precision):
    """gaussian's upper key 2 P - factor (Q + K) + additive, evaluated in float32 as the kernel does
    (fma(2, P, fma(-factor, Q, additive / 2)) + fma(-factor, K, additive / 2), Q and K the FMA chains
    of select.sums_of_squares), is at least the IEEE kernel's key -D (D the FMA chain of the rounded
    differences' squares) and the exact one, for P from every emulated tensor-core arithmetic of
    test_the_score_error_bound_holds_against_float64_for_every_emulated_realisation, D from 16 to
    4096; and on Gaussian rows near the origin at the heads' D (up to 64) the bound is within twice
    the dot product's model bound (2^-12 more) of Q + K: the dot product's error, little else."""
    dtype = torch.bfloat16 if precision == "exact" else torch.float32
    for d in (16, 64, 4096):
        x, y = gaussian_inputs(case, d, dtype, pairs=64 if d == 4096 else 256)
        model, _, absolute, factor, additive = kernel_bounds(d, precision == "exact",
                                                             "tf32x3" if precision == "exact" else precision)
        q_squares, k_squares = _sums_of_squared(x).float(), _sums_of_squared(y).float()
        differences = (x.float() - y.float())
        ieee_key = -_sums_of_squared(differences)
        exact_key = -((x.double() - y.double()) ** 2).sum(1)
        finite = torch.isfinite(q_squares) & torch.isfinite(k_squares) & torch.isfinite(ieee_key)
        half = torch.tensor(additive / 2, dtype=torch.float32)
        factor = torch.tensor(factor, dtype=torch.float32)
        row_terms, column_terms = _fma(-factor, q_squares, half), _fma(-factor, k_squares, half)
        for rounding in ("truncated", "nearest"):
            terms = _terms(x, y, precision, rounding)
            for order in ("in order", "reversed", "shuffled", "pairwise"):
                products = _float32_sum(terms, order, rounding)
                upper = (_fma(products, torch.tensor(2.0), row_terms) + column_terms).double()
                assert (upper[finite] >= ieee_key[finite]).all(), (d, rounding, order)
                assert (upper[finite] >= exact_key[finite]).all(), (d, rounding, order)
                if case == "gaussian" and d <= 64:
                    slack = (upper - ieee_key) / (q_squares.double() + k_squares.double())
                    assert slack.max() <= 2 * model + 2.0 ** -12, (d, rounding, order, slack.max(), model)


# --- the kernels under test ---------------------------------------------------------------------------

def row_layout(t):
    return (t.stride(0), 0, t.stride(1))


def similarity_constant(d, similarity):
    """The kernels' similarity_constant, as the C++ launcher passes it: sqrt(D) in float32 for scaled_dot,
    cosine's epsilon for cosine."""
    if similarity == SCALED_DOT:
        return float(torch.tensor(float(d)).sqrt())
    if similarity == COSINE:
        import convnn  # noqa: F401  (the ops)
        return float(torch.tensor(torch.ops.convnn.cosine_eps(), dtype=torch.float32))
    return 1.0


def mask_operand(queries, mask):
    """(MASK kind, pointer argument, slice stride) of a bool or additive mask [G,N,M] or [N,M], or none."""
    if mask is None:
        return select.NO_MASK, queries, 0
    kind = select.BOOL_MASK if mask.dtype == torch.bool else select.ADDITIVE_MASK
    return kind, mask.contiguous(), (mask.shape[-2] * mask.shape[-1] if mask.dim() == 3 else 0)


def mask_words(mask):
    """(the words the tensor-core kernel reads of a bool mask [G, N, M] or [N, M]: _mask_bits_kernel's
    [G * N or N, words + 1], the blocks' whole words [G or 1, blocks of ROWS of N], the words' slice
    stride); the words start as a sentinel, so that one the kernel leaves unwritten shows."""
    m = mask.shape[-1]
    n = mask.shape[-2]
    rows, words = mask.numel() // m, triton.cdiv(m, bounded_select.CANDIDATES)
    bits = torch.full((rows, words + 1), 0x5A5A, dtype=torch.int64, device=DEVICE)
    bits[:, words] = 0  # the words reaching the last true entry: zeros on entry, as the launcher's
    wholes = torch.full((rows // n, triton.cdiv(n, bounded_select.ROWS)), words, dtype=torch.int32, device=DEVICE)
    bounded_select._mask_bits_kernel[(triton.cdiv(rows, bounded_select.MASK_BITS_ROWS), words)](
        mask.contiguous(), bits, wholes, rows, n, m, words, ROWS=bounded_select.MASK_BITS_ROWS,
        CANDIDATES=bounded_select.CANDIDATES, BLOCK_ROWS=bounded_select.ROWS)
    return bits, wholes, (n * (words + 1) if mask.dim() == 3 else 0)


def test_a_bool_masks_words_hold_its_entries_bit_by_bit_and_none_past_m():
    """_mask_bits_kernel against the bits built in torch: [N, M] and [G, N, M] masks, M = 150 (a
    partial last word), 64, 1 and 256, rows past a program's block; bit 63 (a negative int64) included;
    each row's words reaching its last true entry (rows ending in each word, a row without one); and
    each block of ROWS rows' leading whole words (every bit of the word set in every row of the block:
    a partial last word never is), on causal and all-true masks too."""
    generator = torch.Generator().manual_seed(49)
    causal = torch.ones(130, 256).tril(diagonal=100).bool()
    for mask in (torch.rand(70, 150, generator=generator) > 0.5, torch.rand(2, 33, 64, generator=generator) > 0.5,
                 torch.rand(5, 1, generator=generator) > 0.5, torch.rand(40, 128, generator=generator) > 0.5,
                 torch.ones(2, 70, 128, dtype=torch.bool), causal, torch.ones(3, 150, dtype=torch.bool)):
        shape = tuple(mask.shape)
        if shape[-1] >= 64 and not mask.all() and mask is not causal:
            mask[..., 63] = True
        rows = mask.view(-1, shape[-1])
        if not mask.all() and mask is not causal:
            rows[1::3, -shape[-1] // 2:] = False
            rows[2] = False
        m, n = shape[-1], shape[-2]
        words = triton.cdiv(m, 64)
        padded = torch.nn.functional.pad(mask.reshape(-1, m).long(), (0, words * 64 - m)).view(-1, words, 64)
        want = (padded << torch.arange(64)).sum(-1)
        last = torch.where(rows, torch.arange(m), -1).amax(-1)
        reach = torch.where(last >= 0, last // 64 + 1, 0)
        whole = padded.bool().all(-1)  # [rows, words]
        leading = torch.where(~whole, torch.arange(words), words).amin(-1).view(-1, n)
        blocks = triton.cdiv(n, bounded_select.ROWS)
        leading = torch.nn.functional.pad(leading, (0, blocks * bounded_select.ROWS - n), value=words)
        got, wholes, stride = mask_words(mask.to(DEVICE))
        assert torch.equal(got.cpu(), torch.cat([want, reach[:, None]], 1)), shape
        assert torch.equal(wholes.cpu().long(), leading.view(-1, blocks, bounded_select.ROWS).amin(-1)), shape
        assert stride == (n * (words + 1) if len(shape) == 3 else 0)
    assert mask_words(causal.to(DEVICE))[1].tolist() == [[1, 2, 3]]  # rows 0, 64, 128 see 101, 165, 229 keys


def key_norms(keys):
    """The keys' norms buffer [G, NORM_SECTIONS, M + 1] (bounded_select._key_norms_kernel's)."""
    g, m, d = keys.shape
    norms = torch.zeros((g, bounded_select.NORM_SECTIONS, m + 1), device=DEVICE)
    bounded_select._key_norms_kernel[(triton.cdiv(m, bounded_select.KEY_NORM_ROWS), g)](
        keys, norms, m, d, similarity_constant(d, COSINE), 1, *row_layout(keys), BLOCK=bounded_select.KEY_NORM_ROWS,
        FEATURES=bounded_select.FEATURES, CANDIDATES=bounded_select.CANDIDATES)
    return norms


def seeded(queries, keys, k, similarity, mask_arg, wholes, mask_stride, kind, norms, inject="none", bound_scale=1.0):
    """The rows' seeds [G * N] (bounded_select._seed_thresholds_kernel; the mask as the select kernel
    takes it: mask_operand's, a bool one as its words and its blocks' whole words, else any int32)."""
    g, n, d = queries.shape
    m = keys.shape[1]
    seeds = torch.full((g * n,), 3.5, device=DEVICE)
    bounded_select._seed_thresholds_kernel[(triton.cdiv(n, bounded_select.ROWS), g)](
        queries, keys, mask_arg, wholes, norms, seeds, n, m, d, k, mask_stride, 1, similarity_constant(d, similarity),
        bound_scale, 1, *row_layout(queries), *row_layout(keys), SIMILARITY=similarity, MASK=kind,
        ROWS=bounded_select.ROWS, CANDIDATES=bounded_select.CANDIDATES, FEATURES=bounded_select.FEATURES,
        PRECISION=bounded_select.FLOAT32_PRECISION, PRODUCT_FEATURES=bounded_select.SEED_PRODUCT_FEATURES,
        INJECT=bounded_select.INJECTIONS[inject],
        num_warps=bounded_select.seed_warps(str(queries.dtype).replace("torch.", "")))
    return seeds


def bounded(queries, keys, k, similarity, mask=None, inject="none", bound_scale=1.0, programs=3, rescored=None,
            step_tiles=1):
    """(scores, indices, redo) of the tensor-core kernel alone: unsettled rows' outputs unwritten.
    `programs`: the persistent grid's, fewer than the blocks of most calls here (each program takes
    several blocks in turn, through one queue). rescored (int32 [3, G * N]): gets the candidates each
    row re-scored exactly, the tiles its block scored and the tiles its loop took (the kernel's
    STATS). step_tiles: the kernel's STEP_TILES (bounded_select.tiles_per_step)."""
    g, n, d = queries.shape
    m = keys.shape[1]
    kind, mask_arg, mask_stride = mask_operand(queries, mask)
    wholes = redo = torch.full((g * n,), 9, dtype=torch.int32, device=DEVICE)  # wholes: unread without a bool mask
    if kind == select.BOOL_MASK:  # read as its words, as the C++ launcher passes it
        mask_arg, wholes, mask_stride = mask_words(mask_arg)
    slots = select.slots_for(k)
    scores = torch.full((g, n, k), 1234.5, device=DEVICE)
    indices = torch.full((g, n, k), -7, dtype=torch.int64, device=DEVICE)
    queue = torch.full((programs * bounded_select.ROWS, bounded_select.QUEUE), -5, dtype=torch.int32,
                       device=DEVICE)
    norms = key_norms(keys)
    precision = bounded_select.FLOAT32_PRECISION
    seeds = norms  # unread where the kernel takes no seeds (bounded_select._tile_bound)
    if bounded_select._tile_bound(similarity, kind):
        seeds = seeded(queries, keys, k, similarity, mask_arg, wholes, mask_stride, kind, norms, inject, bound_scale)
    # A bool mask's select in two launches (its whole tiles, then the others), one otherwise.
    for part in (1, 2) if kind == select.BOOL_MASK else (0,):
        bounded_select._bounded_select_kernel[(programs,)](
            queries, keys, mask_arg, wholes, scores, indices, redo, redo if rescored is None else rescored, norms,
            seeds, queue, g, n, m, d, k, mask_stride, 1, similarity_constant(d, similarity), bound_scale,
            select.DTYPE_CODES[torch.float32], 1, *row_layout(queries), *row_layout(keys), SIMILARITY=similarity,
            MASK=kind, ROWS=bounded_select.ROWS, CANDIDATES=bounded_select.CANDIDATES, SLOTS=slots,
            QUEUE=bounded_select.QUEUE, FLUSH=bounded_select.FLUSH, FEATURES=bounded_select.FEATURES,
            PRECISION=precision, INJECT=bounded_select.INJECTIONS[inject], STATS=rescored is not None,
            STEP_TILES=step_tiles, PART=part)
    return scores, indices, redo


def rerun(queries, keys, k, similarity, mask, scores, indices, redo):
    """The rerun kernel over the tensor-core kernel's outputs (in place)."""
    g, n, d = queries.shape
    kind, mask_arg, mask_stride = mask_operand(queries, mask)
    slots = select.slots_for(k)
    blocks, _ = select.design(slots, kind)
    bounded_select._rerun_kernel[(triton.cdiv(n, blocks["ROWS"]), g)](
        queries, keys, mask_arg, scores, indices, redo, n, keys.shape[1], d, k, mask_stride, 1,
        similarity_constant(d, similarity),
        select.DTYPE_CODES[torch.float32], 1, *row_layout(queries), *row_layout(keys), SIMILARITY=similarity,
        MASK=kind, SLOTS=slots, FEATURES=select.features_for(d), **blocks)


def ieee(queries, keys, k, similarity, mask=None):
    """select.py's IEEE kernel: (scores, indices)."""
    g, n, d = queries.shape
    kind, mask_arg, mask_stride = mask_operand(queries, mask)
    slots = select.slots_for(k)
    blocks, _ = select.design(slots, kind)
    scores = torch.empty(g, n, k, device=DEVICE)
    indices = torch.empty(g, n, k, dtype=torch.int64, device=DEVICE)
    select._select_kernel[(triton.cdiv(n, blocks["ROWS"]), g)](
        queries, keys, mask_arg, scores, indices, n, keys.shape[1], d, k, mask_stride, 1,
        similarity_constant(d, similarity),
        select.DTYPE_CODES[torch.float32], 1, *row_layout(queries), *row_layout(keys), SIMILARITY=similarity,
        MASK=kind, SLOTS=slots, FEATURES=select.features_for(d), **blocks)
    return scores, indices


def assert_same_selection(queries, keys, k, similarity, mask=None, inject="none", bound_scale=1.0):
    """The two launches give the IEEE kernel's outputs exactly; the settled rows are written by the
    first, the others untouched by it; without a mask, with one tile a step and with two (an sm_80's
    and an sm_90's kernel: bounded_select.tiles_per_step). Returns (the redo flags [G, N] bool, the
    candidates each row re-scored exactly [G, N], the tiles each row's block scored and its loop took
    [2, G, N]), of the last launch."""
    g, n, _ = queries.shape
    want = ieee(queries, keys, k, similarity, mask)
    for step_tiles in (1, 2) if mask is None or mask.dtype == torch.bool else (1,):
        rescored = torch.full((3, g * n), -1, dtype=torch.int32, device=DEVICE)
        scores, indices, redo = bounded(queries, keys, k, similarity, mask, inject, bound_scale, rescored=rescored,
                                        step_tiles=step_tiles)
        flagged = redo.view(g, n).cpu().bool()
        assert set(redo.cpu().tolist()) <= {0, 1}
        assert (indices.cpu()[flagged] == -7).all() and (scores.cpu()[flagged] == 1234.5).all()
        assert torch.equal(indices.cpu()[~flagged], want[1].cpu()[~flagged]), step_tiles
        assert torch.equal(scores.cpu()[~flagged], want[0].cpu()[~flagged]), step_tiles
        rerun(queries, keys, k, similarity, mask, scores, indices, redo)
        assert torch.equal(indices, want[1]), (k, similarity, inject, step_tiles)
        assert torch.equal(scores.nan_to_num(7.5), want[0].nan_to_num(7.5)), (k, similarity, inject, step_tiles)
    return flagged, rescored[0].view(g, n).cpu(), rescored[1:].view(2, g, n).cpu()


def dyadic(shape, generator, span=16, bits=2):
    """Values i / 2^bits, |i| <= span: every dot product of a few of them is exact in float32."""
    return (torch.randint(-span, span + 1, shape, generator=generator).float() / 2 ** bits)


@pytest.mark.parametrize("d", [16, 48, 176])
def test_the_two_tile_steps_copies_and_the_seeds_chunks_cover_every_feature_and_no_more(d):
    """The two-tile step multiplies TMA copies of DESCRIBED_FEATURES (64) features, zero past D
    (_described_products), and the seeds kernel by chunks of 4 FEATURES (_staged_products'
    PRODUCT_FEATURES), the first and last narrower where D is not a multiple: D = 16 and 48 (one copy,
    partly zeros; the seeds: one chunk of 16, or of 32 then 16) and 176 (the step: the block's copy of
    the queries and two more of both, the last partly zeros; the seeds: a first of 64, the loop's of
    64, then 32 and 16), dot and scaled_dot, K 8, exact and with errors injected up to the bound: the
    IEEE kernel's selection bit for bit (a feature left out of a product, or the next row's read as
    features past D, moves the gate past the true K-th: the selection differs)."""
    generator = torch.Generator().manual_seed(48 + d)
    queries = dyadic((1, 70, d), generator).to(DEVICE)
    keys = dyadic((1, 150, d), generator).to(DEVICE)
    for similarity in (DOT, SCALED_DOT):
        for inject in ("none", "scattered"):
            flagged, _, _ = assert_same_selection(queries, keys, 8, similarity, inject=inject)
            assert not flagged.any(), (d, similarity, inject)


@pytest.mark.parametrize("inject", [name for name in bounded_select.INJECTIONS if name != "none"])
def test_injected_errors_up_to_the_bound_leave_the_ieee_selection_bit_for_bit(inject):
    """Two slices of 70 rows against 150 candidates (three tiles, the last short; two blocks of rows,
    the last short; a persistent grid of three programs, so that a program takes several blocks
    through one queue), D = 32 (sqrt(D) inexact) and 64: for dot, scaled_dot, cosine and gaussian,
    K = 1, 8, 13, without a mask, with a bool mask (rows with fewer valid candidates than K, one with
    none) and an additive 0 / -inf mask; the bound from 1 to 2^16 times its size (a bound of
    2^12 * 2^-15 * |q||k| lets most candidates through the gate): every row settles, as the IEEE
    kernel's, whether the gate queued a few candidates or every one. (Gaussian's at 2^8: there a gate
    without gaussian_bound's own terms, the dot product's error alone, failed four of the five kinds.)"""
    generator = torch.Generator().manual_seed(41)
    queries = dyadic((2, 70, 32), generator).to(DEVICE)
    keys = dyadic((2, 150, 32), generator).to(DEVICE)
    short = torch.rand(2, 70, 150, generator=generator) > 0.5
    short[0, 0, :] = False
    short[1, 4, :] = False
    short[1, 4, 140:143] = True
    additive = torch.where(torch.rand(70, 150, generator=generator) > 0.3, 0.0, float("-inf"))
    rescored = []
    for k, similarity, mask, scale in ((1, DOT, None, 1.0), (8, SCALED_DOT, short, 2.0 ** 12),
                                       (13, SCALED_DOT, additive, 2.0 ** 10), (8, DOT, None, 2.0 ** 16),
                                       (8, COSINE, short, 2.0 ** 6), (13, GAUSSIAN, additive, 2.0 ** 8)):
        flagged, counts, _ = assert_same_selection(queries, keys, k, similarity,
                                                   None if mask is None else mask.to(DEVICE), inject, scale)
        assert not flagged.any()
        rescored.append(counts)
    wide_queries, wide_keys = dyadic((2, 70, 64), generator).to(DEVICE), dyadic((2, 150, 64), generator).to(DEVICE)
    flagged, counts, _ = assert_same_selection(wide_queries, wide_keys, 8, SCALED_DOT, short.to(DEVICE), inject,
                                               2.0 ** 10)
    assert not flagged.any()
    # The gate cut (K = 1, the bound as it is): fewer than M re-scored in every row; the inflated bound
    # let more through (not those whose error was drawn at minus the bound).
    assert rescored[0].max() < 150 and rescored[3].sum() > rescored[0].sum(), (rescored[0], rescored[3])


def test_rows_without_whole_chunks_of_features_go_to_the_rerun():
    """D = 6 (not whole chunks of FEATURES: the launcher takes the IEEE kernel), and D = 32 on rows
    that do not start on 16-byte boundaries: the tensor-core kernel scores no tile and flags every row;
    the rerun gives the IEEE kernel's selection."""
    generator = torch.Generator().manual_seed(45)
    flagged, _, _ = assert_same_selection(dyadic((1, 20, 6), generator).to(DEVICE),
                                       dyadic((1, 70, 6), generator).to(DEVICE), 4, DOT)
    assert flagged.all()
    shifted = dyadic((1, 20 * 32 + 1), generator).to(DEVICE)[:, 1:].view(1, 20, 32)
    flagged, _, _ = assert_same_selection(shifted, dyadic((1, 70, 32), generator).to(DEVICE), 4, SCALED_DOT)
    assert flagged.all()


def rows_apart(rows, stride, generator):
    """[1, rows, 32] dyadic rows `stride` float32s apart (a view of one buffer: untouched pages cost nothing)."""
    buffer = torch.empty((rows - 1) * stride + 32)
    view = buffer.as_strided((1, rows, 32), (buffer.numel(), stride, 1))
    view.copy_(dyadic((1, rows, 32), generator))
    return view


def test_rows_whose_tiles_offsets_pass_32_bits_go_to_the_rerun():
    """The tiles address a block's query rows and a step's key rows by 32-bit offsets from their first
    (_upper_keys): key rows so far apart that TILE_OFFSET_ROWS of them pass 2^31 elements, and query
    rows so far apart that ROWS of them do (whole chunks on 16-byte boundaries, so only that rule
    refuses them; the launcher takes the IEEE kernel then): no tile scored, every row flagged, and the
    rerun gives the IEEE kernel's selection."""
    generator = torch.Generator().manual_seed(46)
    limit = 2**31 - 1 - 32
    wide_keys = rows_apart(3, (limit // (bounded_select.TILE_OFFSET_ROWS - 1) // 16 + 1) * 16, generator)
    flagged, _, tiles = assert_same_selection(dyadic((1, 5, 32), generator).to(DEVICE), wide_keys.to(DEVICE), 2, DOT)
    assert flagged.all() and (tiles == 0).all()
    wide_queries = rows_apart(2, (limit // (bounded_select.ROWS - 1) // 16 + 1) * 16, generator)
    flagged, _, tiles = assert_same_selection(wide_queries.to(DEVICE), dyadic((1, 70, 32), generator).to(DEVICE), 4,
                                              SCALED_DOT)
    assert flagged.all() and (tiles == 0).all()


def test_the_dot_products_gate_at_a_tiles_largest_key_norm_keeps_the_ieee_selection():
    """dot and scaled_dot take their bound from the threshold at the tile's largest key norm. The keys'
    norms launch writes each tile's largest norm (M = 150: tiles of 64, 64 and 22 keys) beside the
    norms; keys whose norms differ within a tile by up to 2^10 (a few large keys in the second and
    third tiles, so the bound at the tile's largest is 2^10 times most pairs' own, and a step of two
    tiles must take its second tile's largest), errors injected up to each pair's own bound (x 2^4,
    the bound inflated as much) at both signs: every row settles, as the IEEE kernel's, at K = 1, 8
    and 13, without a mask and with a bool mask; at the bound's own size the gate still cuts (fewer
    than M re-scored per row, K = 1)."""
    generator = torch.Generator().manual_seed(46)
    queries = dyadic((2, 70, 32), generator).to(DEVICE)
    keys = dyadic((2, 150, 32), generator)
    keys[:, 70::37] *= 2.0 ** 10  # in the second and third tiles: a step of two tiles takes the larger
    keys = keys.to(DEVICE)
    g, m, d = keys.shape
    norms = torch.zeros((g, bounded_select.NORM_SECTIONS, m + 1), device=DEVICE)
    bounded_select._key_norms_kernel[(triton.cdiv(m, bounded_select.KEY_NORM_ROWS), g)](
        keys, norms, m, d, similarity_constant(d, COSINE), 1, *row_layout(keys), BLOCK=bounded_select.KEY_NORM_ROWS,
        FEATURES=bounded_select.FEATURES, CANDIDATES=bounded_select.CANDIDATES)
    tiles = triton.cdiv(m, bounded_select.CANDIDATES)
    largest = torch.nn.functional.pad(norms[:, 0, :m], (0, tiles * bounded_select.CANDIDATES - m)).view(g, tiles, -1)
    assert torch.equal(norms[:, 3, :tiles], largest.amax(-1)) and (norms[:, 3, tiles:] == 0).all()
    torch.testing.assert_close(norms[:, 0, :m].cpu(), _norms(keys.cpu().view(-1, d)).view(g, m), rtol=1e-6, atol=0)
    mask = (torch.rand(2, 70, 150, generator=generator) > 0.3).to(DEVICE)
    for inject in ("even up", "odd up"):
        for k, similarity, mask_here in ((1, DOT, None), (8, SCALED_DOT, None), (13, DOT, mask), (8, SCALED_DOT, mask)):
            flagged, _, _ = assert_same_selection(queries, keys, k, similarity, mask_here, inject, 2.0 ** 4)
            assert not flagged.any(), (inject, k, similarity)
    # The bound as it is (TF32's, 2^-9 of |q| times the tile's largest norm): the gate still cuts; with
    # two tiles a step, the step's largest norm (the second step's second tile past M: not scored).
    _, counts, tiles = assert_same_selection(queries, keys, 1, DOT)
    assert counts.max() < m and (tiles == 3).all(), (counts, tiles)


def test_dot_products_start_from_their_seeds_and_keep_the_ieee_selection():
    """dot and scaled_dot start each row's threshold from its seed (the K-th largest of the columns'
    largest lower bounds over the first tiles: _seed_thresholds_kernel), not at -inf, where every
    candidate of the first tile passed: with M = 64 (one tile) the rows re-score fewer than its 64
    candidates, K = 1 and 8, errors injected up to the bound at both signs; with a bool mask leaving a
    row fewer valid candidates than K (so fewer columns holding one) that row starts at -inf, its top
    open, and re-scores every candidate (the masked ones fill its empty slots); keys all equal (every
    score ties: the K lowest indices, whatever errors the columns' largest bounds carry; the rounds
    that take the K-th count every tied column at once); the IEEE kernel's selection every time."""
    generator = torch.Generator().manual_seed(47)
    queries = dyadic((1, 70, 32), generator).to(DEVICE)
    keys = dyadic((1, 64, 32), generator).to(DEVICE)
    mask = torch.ones(1, 70, 64, dtype=torch.bool)
    mask[0, 3, 5:] = False  # row 3: five valid candidates, fewer than K = 8
    for inject in ("none", "even up", "odd up"):
        for k, similarity in ((1, DOT), (8, SCALED_DOT)):
            flagged, counts, _ = assert_same_selection(queries, keys, k, similarity, None, inject)
            assert not flagged.any() and counts.max() < 64, (inject, k, counts)
        flagged, counts, _ = assert_same_selection(queries, keys, 8, SCALED_DOT, mask.to(DEVICE), inject)
        others = torch.arange(70) != 3
        assert not flagged.any() and counts[0, 3] == 64 and counts[0, others].max() < 64, (inject, counts)
    tied = keys[:, :1].expand(1, 64, 32).contiguous()
    for inject in ("scattered", "later up", "earlier up"):
        flagged, _, _ = assert_same_selection(queries, tied, 8, DOT, None, inject, 2.0 ** 4)
        assert not flagged.any(), inject


@pytest.mark.parametrize("inject", ["none", "even up", "odd up", "later up"])
def test_seeds_are_lower_bounds_of_each_rows_kth_exact_dot_product(inject):
    """_seed_thresholds_kernel, alone, float32 (TF32's bound, x 2^4, errors injected up to it): each
    row's seed is at most its K-th largest exact dot product over the valid candidates of the first
    SEED_TILES tiles (dyadic features: exact in float32) and at least the K-th largest of the columns'
    largest exact products there less twice the bound at the largest norms (the rule the kernel
    follows, in float64); -inf where fewer than K columns hold a valid candidate. Rows of 40
    against M = 2100 (33 tiles: the last, not whole, past the seeds' reach, holds products above every
    other, which a seed reading it would take), K = 1, 8 and 13; a bool mask leaving row 1 seven valid
    candidates and every row's candidates 2000 and up (no tile whole for the block: every tile's bits
    tested); a bool mask true for every row up to candidate 640, then ending at 640 + 30 r in row r (10
    tiles whole for the block, taken without the bits' test, then tiles tested); keys all equal (every
    product ties: the seed is the tied value, less at most the bound)."""
    generator = torch.Generator().manual_seed(49)
    queries = dyadic((1, 40, 32), generator)
    keys = dyadic((1, 2100, 32), generator)
    keys[0, 2048:] = 4 * queries[0].sign().repeat(2, 1)[:52]
    ragged = torch.ones(1, 40, 2100, dtype=torch.bool)
    ragged[0, 1, 7:] = False
    ragged[0, :, 2000:] = False
    staircase = torch.arange(2100)[None, None, :] < 640 + 30 * torch.arange(40)[None, :, None]
    seen = min(bounded_select.SEED_TILES, 2100 // bounded_select.CANDIDATES) * bounded_select.CANDIDATES
    scale = 2.0 ** 4
    model = kernel_bound(32, False, bounded_select.FLOAT32_PRECISION)[0] + 2.0 ** -21

    def check(keys, k, mask):
        kind, mask_arg, stride = mask_operand(queries.to(DEVICE), None if mask is None else mask.to(DEVICE))
        wholes = torch.zeros(1, dtype=torch.int32, device=DEVICE)  # unread without a bool mask
        if kind == select.BOOL_MASK:
            mask_arg, wholes, stride = mask_words(mask_arg)
        seeds = seeded(queries.to(DEVICE), keys.to(DEVICE), k, DOT, mask_arg, wholes, stride, kind,
                       key_norms(keys.to(DEVICE)), inject, scale).cpu().double()
        valid = torch.ones(40, seen, dtype=torch.bool) if mask is None else mask[0, :, :seen]
        products = torch.where(valid, (queries.double() @ keys.double().transpose(1, 2))[0, :, :seen], -torch.inf)
        columns = products.view(40, -1, bounded_select.CANDIDATES).amax(1)
        slack = 2.1 * scale * model * queries[0].double().norm(dim=1) * keys[0, :seen].double().norm(dim=1).max()
        few = (columns > -torch.inf).sum(1) < k
        assert (seeds[few] == -torch.inf).all(), (k, mask is not None, seeds[few])
        kth = products.topk(k, dim=1).values[:, -1]
        least = columns.topk(k, dim=1).values[:, -1] - slack
        assert ((least <= seeds) & (seeds <= kth))[~few].all(), (k, mask is not None, least, seeds, kth)

    for k, mask in ((1, None), (8, None), (13, ragged), (8, ragged), (8, staircase)):
        check(keys, k, mask)
    check(keys[:, :1].expand(1, 2100, 32).contiguous(), 8, None)


def special_inputs():
    """Queries [1, 40, 32] and keys [1, 100, 32] (the first 4 features set, the rest 0) with rows the
    gate must not settle or must settle right: +0 and -0 scores that tie; every candidate equal (the K
    lowest indices); a NaN query, an Inf key; norms whose product overflows float32 beside exact
    scores that do not (1e20 * 1e-20)."""
    generator = torch.Generator().manual_seed(42)
    queries = torch.nn.functional.pad(dyadic((1, 40, 4), generator), (0, 28))
    keys = torch.nn.functional.pad(dyadic((1, 100, 4), generator), (0, 28))
    queries[0, 1, :4] = torch.tensor([0.0, 0.0, 1.0, 0.0])
    keys[0, 10:20, :4] = torch.tensor([1.0, 0.0, 0.0, 0.0])   # score +0 with row 1
    keys[0, 20:30, :4] = torch.tensor([0.0, 0.0, -0.0, 0.0])  # score -0 with row 1
    queries[0, 2, :4] = torch.tensor([0.0, 0.0, 0.0, 1.0])    # every key but a few scores 0: ties everywhere
    queries[0, 3, 1] = float("nan")
    keys[0, 50, 2] = float("inf")                             # +inf or -inf or NaN scores for every row
    queries[0, 5, :4] = torch.tensor([1e20, 0.0, 0.0, 0.0])
    keys[0, 60, :4] = torch.tensor([1e-20, 0.0, 0.0, 3e18])   # huge scores; row 5: |q|^2 overflows, q.k = 1
    return queries.to(DEVICE), keys.to(DEVICE)


def test_ties_zeros_nan_inf_and_overflowing_norms_give_the_ieee_selection():
    """The special rows of special_inputs, at K = 4 and 16 (dot) and 4 (cosine, gaussian): the Inf key
    makes every row that meets a NaN or +inf key unrankable (NaN scores, as the IEEE kernel), and the
    NaN query's row: a key whose norm is not finite sends its whole slice to the rerun, a query row
    whose norm is not finite or could overflow (the NaN one, the 1e20 one) itself alone; the result is
    the IEEE kernel's; with a bool mask too, across its two launches."""
    queries, keys = special_inputs()
    clean_keys = keys.clone()
    clean_keys[0, 50, 2] = 0.0
    for k, similarity in ((4, DOT), (16, DOT), (4, COSINE), (4, GAUSSIAN)):
        flagged, _, _ = assert_same_selection(queries, keys, k, similarity)
        assert flagged.all(), (k, similarity)  # a key with an infinite norm: its slice's rows all rerun
        flagged, _, _ = assert_same_selection(queries, clean_keys, k, similarity, inject="earlier up",
                                              bound_scale=2.0 ** 6)
        assert flagged[0, 3] and flagged[0, 5] and flagged.sum() == 2, (k, similarity, flagged)
    # With a bool mask whose first tile is whole (part 1 scores it, part 2 the rest from part 1's top): the
    # rows part 1 flags stay flagged, untouched by either launch.
    padding = torch.ones(40, 100, dtype=torch.bool, device=DEVICE)
    padding[:, 90:] = False
    flagged, _, _ = assert_same_selection(queries, keys, 4, DOT, padding)
    assert flagged.all()
    flagged, _, _ = assert_same_selection(queries, clean_keys, 4, DOT, padding, inject="earlier up",
                                          bound_scale=2.0 ** 6)
    assert flagged[0, 3] and flagged[0, 5] and flagged.sum() == 2, flagged


def test_a_bound_past_every_score_gap_flushes_every_tile_and_still_settles_every_row():
    """A bound inflated past every score gap lets every candidate through the gate: the queue is full
    after each tile (M = 150, three tiles) and flushed before the next; with fewer valid candidates
    than K (the masked ones fill the slots, lower index first) every row still settles, as the IEEE
    kernel's; without a mask (M = 300) every candidate of every step is queued and re-scored."""
    generator = torch.Generator().manual_seed(43)
    queries = dyadic((1, 20, 32), generator).to(DEVICE)
    keys = dyadic((1, 150, 32), generator).to(DEVICE)
    mask = (torch.rand(1, 20, 150, generator=generator) > 0.9).to(DEVICE)
    flagged, rescored, _ = assert_same_selection(queries, keys, 16, DOT, mask, inject="scattered",
                                                 bound_scale=2.0 ** 20)
    assert not flagged.any() and (rescored >= 64).all(), rescored
    # Without a mask, two tiles a step: the queue takes a whole step's 128 (QUEUE holds FLUSH_AT - 1 more).
    keys = dyadic((1, 300, 32), generator).to(DEVICE)
    flagged, rescored, _ = assert_same_selection(queries, keys, 16, DOT, inject="scattered", bound_scale=2.0 ** 20)
    assert not flagged.any() and (rescored == 300).all(), rescored


@pytest.mark.parametrize("similarity", [SCALED_DOT, GAUSSIAN])
def test_tiles_a_bool_mask_hides_from_every_deciding_row_are_not_scored_and_the_selection_stays(similarity):
    """A bool mask: its whole tiles (true for every row of the block) scored first, as without a mask
    (part 1, two tiles a step in the last launch here: the block's whole words rounded down to steps);
    then a tile is scored only where some row of the block has a true entry in it and a threshold
    above -inf (below, every valid candidate is queued whatever its score), and the loop ends after
    the last tile the block's rows' true entries reach once no row's top has an empty slot.
    Causal, N = M = 200 (four blocks of rows, four tiles, the last short): block b takes tiles 0 .. b
    (its diagonal; its first b whole) and scores them, but for gaussian, whose rows start at -inf, the
    first tile past part 1 where part 1 took none (queued unscored; else part 1's exact top, read back,
    sets the threshold); a padding mask (the first 64 keys valid): the first tile alone, scored by
    scaled_dot; an all-true mask: every tile. scaled_dot's rows start at their seeds
    (_seed_thresholds_kernel: the tiles the block's true entries reach) where K columns hold a valid
    candidate (causal rows 7 and up); the causal rows with fewer valid candidates than K (0 .. 6)
    re-score the first tile's 64 alone: once K are ranked, a masked candidate (a -inf key of a higher
    index) cannot enter. The errors scattered up to the bound (x 2^4): the IEEE kernel's selection
    every time."""
    generator = torch.Generator().manual_seed(48)
    queries = dyadic((1, 200, 32), generator).to(DEVICE)
    keys = dyadic((1, 200, 32), generator).to(DEVICE)
    causal = torch.ones(200, 200).tril().bool()
    padding = torch.zeros(200, 200, dtype=torch.bool)
    padding[:, :64] = True
    block = torch.arange(200) // bounded_select.ROWS
    for name, mask, took, whole in (("causal", causal, block + 1, block),
                                    ("padding", padding, torch.ones(200, dtype=torch.long), torch.ones(200)),
                                    ("all true", torch.ones(200, 200, dtype=torch.bool), torch.full((200,), 4),
                                     torch.full((200,), 3))):
        flagged, rescored, tiles = assert_same_selection(queries, keys, 8, similarity, mask.to(DEVICE), "scattered",
                                                         2.0 ** 4)
        assert not flagged.any(), name
        assert torch.equal(tiles[1, 0].long(), took), (name, tiles[1, 0])
        part_1_took_none = whole.long() // 2 == 0  # the last launch's steps: two tiles
        unscored = (part_1_took_none & (similarity == GAUSSIAN)).long()
        assert torch.equal(tiles[0, 0].long(), took - unscored), (name, tiles[0, 0])
        if name == "causal":
            assert (rescored[0, :7] == 64).all(), rescored[0, :7]


def rescored_per_row(queries, keys, k, precisions):
    """{precision: the candidates re-scored exactly per row, on average} with the scores' errors
    scattered up to the model bound (bound_scale 1), FLOAT32_PRECISION set to each in turn."""
    saved = bounded_select.FLOAT32_PRECISION
    counts = {}
    try:
        for precision in precisions:
            bounded_select.FLOAT32_PRECISION = precision
            rescored = torch.zeros(3, queries.shape[0] * queries.shape[1], dtype=torch.int32, device=DEVICE)
            assert not bounded(queries, keys, k, DOT, inject="scattered", rescored=rescored)[2].any()
            counts[precision] = round(float(rescored[0].float().mean()), 1)
    finally:
        bounded_select.FLOAT32_PRECISION = saved
    return counts


def test_candidates_rescored_choose_the_float32_precision(capsys):
    """The measure behind FLOAT32_PRECISION (and the bfloat16 inputs' exact products): 64 query rows,
    D = 64, K = 8, the scores' errors scattered up to the model bound, the rows started from their
    seeds; the candidates each row re-scores exactly (the work the bound adds; no row is left to the
    rerun). Gaussian queries and keys (M = 1024): about K for every precision. Keys and queries in
    tight clusters (64 centres, noise 1% of their scale, M = 2048): TF32's bound (2^-9 |q||k|) lets
    several times more through than tf32x3's (about 2^-14 at D = 64) or bfloat16's, yet its extra
    re-scores (D FMAs each on CUDA cores, about 8 tensor-core multiply-adds' time apiece on an H100:
    67 against 495 TFLOPS) cost a row far less than tf32x3's two more products of every pair (2 M D
    multiply-adds): TF32, which adds no work per tile."""
    generator = torch.Generator().manual_seed(44)
    gaussian = torch.randn(1, 64, 64, generator=generator), torch.randn(1, 1024, 64, generator=generator)
    centres = torch.randn(64, 64, generator=generator)

    def clustered(rows):
        return (centres[torch.randint(0, 64, (rows,), generator=generator)]
                + 0.01 * torch.randn(rows, 64, generator=generator))[None]

    clusters = clustered(64), clustered(2048)
    counts = {}
    for name, (queries, keys) in (("gaussian", gaussian), ("clustered", clusters)):
        counts[name] = rescored_per_row(queries.to(DEVICE), keys.to(DEVICE), 8, ("tf32", "tf32x3"))
        counts[name]["bfloat16 inputs"] = rescored_per_row(queries.to(DEVICE, torch.bfloat16),
                                                           keys.to(DEVICE, torch.bfloat16), 8, ("tf32x3",))["tf32x3"]
    with capsys.disabled():
        print(f"\ncandidates re-scored per row: {counts}")
    gaussian, clustered = counts["gaussian"], counts["clustered"]
    assert max(gaussian.values()) <= 2 * 8 and max(gaussian.values()) <= 1.25 * min(gaussian.values()), counts
    assert clustered["tf32x3"] <= clustered["tf32"] and clustered["bfloat16 inputs"] <= 2 * 8, counts
    extra_rescores = (clustered["tf32"] - clustered["tf32x3"]) * 64 * 8  # in tensor-core multiply-adds' time
    assert 4 * extra_rescores <= 2 * 2048 * 64, counts
    assert bounded_select.FLOAT32_PRECISION == "tf32"


# --- through the op: the C++ path choice and launchers (src/ops/cuda/triton/select_launches.cpp) ---------

def cuda_select(*args):
    """knn_select's CUDA kernel on the test's tensors (the launches through the package's launcher),
    and the keys it launched."""
    import convnn
    from convnn._triton import register

    register.recording = []
    try:
        with convnn.cuda_paths() as paths:
            result = torch.ops.convnn.knn_select.default._op_dk(torch._C.DispatchKey.CUDA, *args)
        launched = list(register.recording)
    finally:
        register.recording = None
    assert paths and all(": Triton kernels" in path for path in paths), paths
    return result, launched


def generic_select(*args):
    return torch.ops.convnn.knn_select.default._op_dk(torch._C.DispatchKey.CompositeExplicitAutograd, *args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_knn_select_on_cuda_scores_on_tensor_cores_where_asked_and_gives_the_generic_selection(monkeypatch, dtype):
    """CONVNN_SELECT_SCORES=tensor_cores: scaled_dot in index order (D = 32: rows of whole chunks), K = 8,
    without a mask and with a bool mask, launches the keys' norms (and the mask's words), the rows' seeds,
    the tensor-core kernel (a bool mask's in two launches) and its rerun (the keys the C++ launcher names,
    as specialisations.py lists them) and gives the generic path's indices and scores; so does a bool mask
    at K = 12; float32 with an additive mask at K = 12 (FLOAT32_MASK_SLOTS), l1 and D = 6 take the IEEE
    kernel. "auto" (the default) takes the IEEE kernel; any other value is refused, naming it."""
    generator = torch.Generator().manual_seed(45)
    queries = dyadic((2, 70, 32), generator).to(DEVICE, dtype)
    keys = dyadic((2, 150, 32), generator).to(DEVICE, dtype)
    mask = (torch.rand(70, 150, generator=generator) > 0.3).to(DEVICE)
    suffix = "" if dtype == torch.float32 else " bfloat16 inputs"
    monkeypatch.setenv("CONVNN_SELECT_SCORES", "tensor_cores")
    for call_mask, mask_name in ((None, "no mask"), (mask, "bool mask")):
        got, launched = cuda_select(queries, keys, 8, "scaled_dot", call_mask, True)
        want = generic_select(queries, keys, 8, "scaled_dot", call_mask, True)
        assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
        # The last ones (the first call's check launches its own before them); a bool mask's select in two
        # launches, its whole tiles first.
        words = ["mask bits"] if call_mask is not None else []
        whole_tiles = [f"bounded select whole tiles scaled_dot K<=8 {mask_name}{suffix}"] if words else []
        expected = [f"key norms{suffix}", *words, f"bounded seeds scaled_dot {mask_name}{suffix}", *whole_tiles,
                    f"bounded select scaled_dot K<=8 {mask_name}{suffix}",
                    f"rerun select scaled_dot K<=8 {mask_name}{suffix}"]
        assert launched[-len(expected):] == expected, launched
    got, launched = cuda_select(queries, keys, 12, "scaled_dot", mask, True)
    assert torch.equal(got[1], generic_select(queries, keys, 12, "scaled_dot", mask, True)[1])
    assert f"bounded select scaled_dot K<=16 bool mask{suffix}" in launched, launched
    additive = torch.where(mask, 0.0, float("-inf")).to(dtype)
    got, launched = cuda_select(queries, keys, 12, "scaled_dot", additive, True)
    assert torch.equal(got[1], generic_select(queries, keys, 12, "scaled_dot", additive, True)[1])
    assert any("bounded" in key for key in launched) == (dtype != torch.float32), launched
    _, launched = cuda_select(queries, keys, 8, "l1", mask, True)
    assert not any("bounded" in key for key in launched) and f"select l1 K<=8 bool mask{suffix}" in launched
    _, launched = cuda_select(queries[..., :6], keys[..., :6], 8, "scaled_dot", None, True)
    assert not any("bounded" in key for key in launched), launched
    monkeypatch.setenv("CONVNN_SELECT_SCORES", "auto")
    _, launched = cuda_select(queries, keys, 8, "scaled_dot", mask, True)
    assert not any("bounded" in key for key in launched), launched
    monkeypatch.setenv("CONVNN_SELECT_SCORES", "fast")
    with pytest.raises(RuntimeError, match="CONVNN_SELECT_SCORES must be 'auto', 'ieee' or 'tensor_cores', got 'fast'"):
        cuda_select(queries, keys, 8, "scaled_dot", mask, True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_mask_slice_serving_several_query_slices_on_tensor_cores_gives_the_mask_repeated(monkeypatch, dtype):
    """CONVNN_SELECT_SCORES=tensor_cores, G = 4 query slices over a bool mask of 2 slices that differ
    (docs/operator.md, "Masks": slices 2 and 3 read the second): the mask's words are made once per
    mask slice (the words kernel's rows: 2 * N), its seeds, whole tiles and selection read the words of
    each query slice's mask slice (select.mask_slice_start), and the indices and scores are the
    repeated mask's, bit for bit, and the generic path's; so with one mask slice for all four."""
    from convnn._triton import register

    generator = torch.Generator().manual_seed(47)
    queries = dyadic((4, 70, 32), generator).to(DEVICE, dtype)
    keys = dyadic((4, 150, 32), generator).to(DEVICE, dtype)
    # Causal-like rows, the first slice's whole (whole tiles on the left of its blocks), the second's with
    # random holes (no whole tile): a query slice that read the other's words or whole tiles would differ.
    masks = ((torch.arange(150)[None, :] <= torch.arange(70)[:, None] * 2)
             & (torch.rand(2, 70, 150, generator=generator) > torch.tensor([-1.0, 0.3])[:, None, None])).to(DEVICE)
    monkeypatch.setenv("CONVNN_SELECT_SCORES", "tensor_cores")
    launches = []
    launch = register.run

    def run(kernel, grid, arguments, constexprs, options):
        launches.append((kernel.fn.__name__, dict(zip(kernel.arg_names, arguments))))
        launch(kernel, grid, arguments, constexprs, options)

    monkeypatch.setattr(register, "run", run)
    for mask in (masks, masks[1:]):
        repeated = mask.repeat_interleave(4 // mask.shape[0], 0)
        launches.clear()
        got, launched = cuda_select(queries, keys, 8, "scaled_dot", mask, True)
        assert any(key.startswith("bounded select scaled_dot K<=8 bool mask") for key in launched), launched
        words = [named for name, named in launches if name == "_mask_bits_kernel"][-1]
        assert words["rows"] == mask.shape[0] * 70
        selects = [named for name, named in launches if name == "_bounded_select_kernel"][-2:]
        assert all(named["slices_per_mask_slice"] == 4 // mask.shape[0] for named in selects)
        want, _ = cuda_select(queries, keys, 8, "scaled_dot", repeated, True)
        assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
        generic = generic_select(queries, keys, 8, "scaled_dot", mask, True)
        assert torch.equal(got[1], generic[1]) and torch.equal(got[0], generic[0])


@pytest.mark.parametrize("similarity", ["cosine", "gaussian"])
def test_cosine_and_gaussian_on_tensor_cores_give_the_ieee_kernels_outputs_through_the_op(monkeypatch, similarity):
    """knn_select's CUDA kernel, bfloat16 and float32 inputs, K = 5, without a mask and (bfloat16) with
    an additive one: the tensor-core kernel and its rerun launched, and the IEEE kernel's indices and
    scores (CONVNN_SELECT_SCORES=ieee) bit for bit."""
    generator = torch.Generator().manual_seed(46)
    additive = torch.where(torch.rand(70, 150, generator=generator) > 0.2, 0.0, float("-inf")).to(DEVICE)
    for dtype, mask in ((torch.float32, None), (torch.bfloat16, None), (torch.bfloat16, additive)):
        queries = dyadic((2, 70, 32), generator).to(DEVICE, dtype)
        keys = dyadic((2, 150, 32), generator).to(DEVICE, dtype)
        monkeypatch.setenv("CONVNN_SELECT_SCORES", "tensor_cores")
        got, launched = cuda_select(queries, keys, 5, similarity, mask, False)
        assert any(key.startswith(f"bounded select {similarity} K<=8") for key in launched), launched
        monkeypatch.setenv("CONVNN_SELECT_SCORES", "ieee")
        want, launched = cuda_select(queries, keys, 5, similarity, mask, False)
        assert not any("bounded" in key for key in launched), launched
        assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0]), (dtype, mask is None)


class _OpsOnCuda(TorchDispatchMode):
    """Runs convnn's ops that have a CUDA kernel by it wherever they are called (knn_attention's CUDA
    kernel and its autograd call the others through the dispatcher, which would pick the CPU kernels of
    the test's CPU tensors), and records their names."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name.startswith("convnn::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, "CUDA"):
            self.calls.append(name)
            with self:  # the mode is off inside its handler: on again for the kernel's own calls
                return func._op_dk(torch._C.DispatchKey.CUDA, *args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def cuda_attention(*args):
    """knn_attention's CUDA kernel, the ops it calls on their CUDA kernels (_OpsOnCuda): (outputs, the
    ops it called, the kernels launched, the path log)."""
    import convnn
    from convnn._triton import register

    register.recording = []
    mode = _OpsOnCuda()
    try:
        with convnn.cuda_paths() as paths, mode:
            result = torch.ops.convnn.knn_attention.default._op_dk(torch._C.DispatchKey.CUDA, *args)
        launched = list(register.recording)
    finally:
        register.recording = None
    return result, mode.calls, launched, list(paths)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_knn_attention_composes_the_tensor_core_select_and_keeps_the_fused_forwards_selection(monkeypatch, dtype):
    """CONVNN_SELECT_SCORES=tensor_cores: knn_attention's CUDA kernel declines the fused forward (its
    running top-K scores every pair in IEEE float32; the path log says why) and composes knn_select on
    tensor cores with rho and the aggregation in one kernel (attention._rho_aggregate_kernel): the
    fused forward's indices and scores (CONVNN_SELECT_SCORES=ieee) bit for bit, and its weights and
    output too in the select's slot order (the same rho and aggregation code on the same scores); in
    index order to rounding (rho sums the slots' exponentials in another order), with and without a
    bool mask. A call the tensor-core kernel does not take (l1; D = 6, not whole chunks) keeps the
    fused forward."""
    generator = torch.Generator().manual_seed(47)
    queries = dyadic((2, 70, 32), generator).to(DEVICE, dtype)
    keys = dyadic((2, 150, 32), generator).to(DEVICE, dtype)
    values = torch.randn(2, 150, 8, generator=generator).to(DEVICE, dtype)
    kernel = torch.randn(8, 8, generator=generator).to(DEVICE, dtype)
    mask = (torch.rand(70, 150, generator=generator) > 0.3).to(DEVICE)
    suffix = "" if dtype == torch.float32 else " bfloat16 inputs"
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    for call_mask, mask_name, index_order in ((None, "no mask", False), (mask, "bool mask", True)):
        args = (queries, keys, values, kernel, None, 8, "scaled_dot", call_mask, index_order, "softmax", 0.5)
        monkeypatch.setenv("CONVNN_SELECT_SCORES", "ieee")
        want, calls, launched, _ = cuda_attention(*args)
        assert calls == ["convnn::knn_attention_device_fused"], calls
        assert launched[-1] == f"attention scaled_dot K<=8 {mask_name}{suffix}", launched
        monkeypatch.setenv("CONVNN_SELECT_SCORES", "tensor_cores")
        got, calls, launched, paths = cuda_attention(*args)
        assert calls == ["convnn::knn_attention_device_fused", "convnn::knn_select",
                         "convnn::knn_attention_rho_aggregate_device_fused"], calls
        assert f"bounded select scaled_dot K<=8 {mask_name}{suffix}" in launched, launched
        assert launched[-1] == f"attention rho aggregate K<=8{suffix}", launched
        assert not any(key.startswith("attention scaled_dot") for key in launched), launched
        assert any(path.startswith("knn_attention: ATen path: knn_select scores this call on tensor cores")
                   for path in paths), paths
        assert torch.equal(got[2], want[2]) and torch.equal(got[1], want[1]), mask_name
        for name, a, b in (("output", got[0], want[0]), ("weights", got[3], want[3])):
            assert a.dtype == b.dtype == dtype, name
            if not index_order:
                assert torch.equal(a, b), f"{mask_name}: {name}"
            torch.testing.assert_close(a.double(), b.double(), rtol=tolerance, atol=tolerance,
                                       msg=lambda m: f"{mask_name}: {name}: {m}")
    for call_queries, call_keys, similarity in ((queries, keys, "l1"), (queries[..., :6], keys[..., :6], "dot")):
        args = (call_queries, call_keys, values, kernel, None, 8, similarity, None, False, "softmax", 0.5)
        _, calls, launched, _ = cuda_attention(*args)
        assert calls == ["convnn::knn_attention_device_fused"] and not any("bounded" in key for key in launched), \
            (similarity, calls, launched)


@pytest.mark.parametrize("rho", ["uniform", "softmax"])
def test_composed_attention_gives_nan_output_rows_where_the_select_could_not_rank(monkeypatch, rho):
    """knn_attention's CUDA composition (CONVNN_SELECT_SCORES=tensor_cores: knn_select on tensor cores,
    rho and the aggregation in one kernel) on a query row holding a NaN: that row's scores, weights
    and output are NaN (whatever rho does with NaN scores: uniform ignores them), and every other row
    is the clean call's, bit for bit. Without the rho and aggregation kernel (a standard kernel
    [C',C,K]: rho_weights, then knn_aggregate) the same: the weights made NaN before the aggregation,
    the output NaN through its arithmetic, the bias added too."""
    monkeypatch.setenv("CONVNN_SELECT_SCORES", "tensor_cores")
    generator = torch.Generator().manual_seed(48)
    queries = dyadic((2, 40, 32), generator).to(DEVICE)
    keys = dyadic((2, 90, 32), generator).to(DEVICE)
    values = torch.randn(2, 90, 8, generator=generator).to(DEVICE)
    bias = torch.randn(8, generator=generator).to(DEVICE)
    poisoned = queries.clone()
    poisoned[1, 7, 3] = float("nan")
    others = torch.ones(2, 40, dtype=torch.bool, device=DEVICE)
    others[1, 7] = False
    # The rho and aggregation kernel answers for the depthwise kernel and declines the standard one.
    rho_aggregate = "convnn::knn_attention_rho_aggregate_device_fused"
    for shape, last_steps in (((8, 8), [rho_aggregate]), ((8, 8, 8), [rho_aggregate, "convnn::knn_aggregate"])):
        kernel = torch.randn(*shape, generator=generator).to(DEVICE)
        args = (keys, values, kernel, bias, 8, "scaled_dot", None, False, rho, 0.5)
        clean, calls, _, _ = cuda_attention(queries, *args)
        assert calls == ["convnn::knn_attention_device_fused", "convnn::knn_select", *last_steps], calls
        got, _, _, _ = cuda_attention(poisoned, *args)
        for name, index in (("output", 0), ("scores", 1), ("weights", 3)):
            assert got[index][1, 7].isnan().all(), (shape, name)
            assert torch.equal(got[index][others], clean[index][others]), (shape, name)
        assert torch.equal(got[2][others], clean[2][others]), shape


def gpu_bench_module():
    """scripts/gpu_bench.py, imported."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "scripts/gpu_bench.py"
    spec = importlib.util.spec_from_file_location("gpu_bench_under_test", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_gpu_bench_runs_its_tensor_core_comparison(monkeypatch):
    """scripts/gpu_bench.py --tensor-cores, a row per kind of features at a size the interpreter
    runs (its timer replaced: CUDA events need a GPU), scaled_dot on each kind and cosine and gaussian
    on Gaussian features, so that a GPU session spends no device time on
    a broken launch: the rows it reports as left to the rerun (none: every norm finite) and the
    candidates re-scored per row (at least K, at most M), and the two scorings' equal outputs
    (on Gaussian features the interpreter's IEEE kernel sums by numpy's matmul, which the re-rank's
    FMA chain may round apart from: equal scores there on a GPU, close here)."""
    bench = gpu_bench_module()
    for kind, similarity in (("gaussian", "scaled_dot"), ("clustered", "scaled_dot"), ("duplicated", "scaled_dot"),
                             ("gaussian", "cosine"), ("gaussian", "gaussian")):
        row = bench.select_scores_row(kind, 2, 96, 16, 8, torch.float32, DEVICE, timer=lambda fn: (fn(), 0.0),
                                      similarity=similarity)
        assert row["indices_equal"] and (row["scores_equal"] or INTERPRETED), row
        assert row["scores_max_difference"] <= 1e-5 * 8, row
        assert row["rows_left_to_the_rerun"] == 0 and 8 <= row["rescored_per_row"] <= 96, row
    assert "CONVNN_SELECT_SCORES" not in os.environ


def test_gpu_bench_refuses_a_triton_figure_measured_on_the_generic_path(monkeypatch):
    """A call timed as the Triton kernels' that took the generic path (here CONVNN_CUDA_KERNELS=generic;
    on a GPU, after a failed or interrupted first-call check) is an error naming the reason, not a
    figure: an H200 run once reported the generic path's float32 times as the tensor-core select's."""
    bench = gpu_bench_module()
    monkeypatch.setenv("CONVNN_CUDA_KERNELS", "generic")
    with pytest.raises(RuntimeError, match="took the generic path.*CONVNN_CUDA_KERNELS=generic"):
        bench.select_scores_row("gaussian", 1, 64, 16, 8, torch.float32, DEVICE, timer=lambda fn: (fn(), 0.0))


def test_gpu_bench_compile_shards_run_each_case_once(monkeypatch):
    """gpu_bench.py --compile-jobs J: its J processes (--compile-shard i/J) run every case of the timed
    step once between them, untimed, so that the timed run finds each kernel compiled."""
    bench = gpu_bench_module()
    seen = []
    monkeypatch.setattr(bench, "training_row", lambda n, causal, dtype, device, timer, **options: seen.append(
        (n, causal, dtype, timer(lambda: "ran"))))
    monkeypatch.setattr(bench, "select_scores_row", lambda kind, g, n, d, k, dtype, device, timer, **options:
                        seen.append((options["similarity"], kind, n, dtype, timer(lambda: "ran"))))
    for mode, cases in (("--training", bench.training_cases(bench.TRAINING_SIZES)),
                        ("--tensor-cores", bench.select_cases(bench.SELECT_SIZES))):
        seen.clear()
        for shard in range(5):
            bench.run_shard(mode, DEVICE, None, f"{shard}/5")
        assert sorted(map(str, seen)) == sorted(str((*case, ("ran", 0.0))) for case in cases), mode
    assert len(bench.select_cases(bench.SELECT_SIZES)) == 26 and len(bench.training_cases(bench.TRAINING_SIZES)) == 6


def test_gpu_bench_runs_its_training_comparison():
    """scripts/gpu_bench.py --training at a size the interpreter runs (2 heads of 96 tokens, D 16, K 8;
    its timer replaced), knn_attention's CUDA kernels and their autograd through _OpsOnCuda: causal
    and not, the forward and backward launch (the tensor-core select, rho and the aggregation, the
    two-kernel backward), and the indices equal the IEEE kernel's, the scores too (here to the last bits: the
    interpreter's IEEE kernel sums by numpy's matmul, test_gpu_bench_runs_its_tensor_core_comparison)."""
    bench = gpu_bench_module()
    for causal in (False, True):
        mode = _OpsOnCuda()
        with mode:
            row = bench.training_row(96, causal, torch.float32, DEVICE, heads=2, d=16,
                                     timer=lambda fn: (fn(), 0.0))
        assert row["indices_equal"] and (row["scores_equal"] or INTERPRETED), row
        assert row["scores_max_difference"] <= 1e-5 * 8, row
        assert {"convnn::knn_select", "convnn::knn_attention_rho_aggregate_device_fused",
                "convnn::knn_attention_backward_device_fused"} <= set(mode.calls), mode.calls
        assert set(row) >= {"forward_ms", "fb_ms", "ieee_forward_ms", "sdpa_forward_ms", "sdpa_fb_ms"}, row
    assert "CONVNN_SELECT_SCORES" not in os.environ
