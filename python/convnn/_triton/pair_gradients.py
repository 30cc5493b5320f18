"""knn_select's backward for the similarities that are not plain dot products (cosine, gaussian,
chebyshev, l1), in Triton (issue 25 §1): it recomputes only the K selected pairs, never the
[G,N,M] scores. The dot products (dot, scaled_dot) take the aggregation kernels instead
(the C++ launcher, src/ops/cuda/triton/select_launches.cpp).

Every pair gradient of these similarities has the form (src/ops/kernels/similarity.h, the
add_pair_gradient of each policy, restated here: a Triton kernel cannot call the C++ policies; the
tests hold the two equal to rounding)

    d score / d self = A * other + B * self + C * sign(self - other) [on feature `arg` only, chebyshev]

with per-pair coefficients from the pair's full-feature statistics:
- cosine:    A = g q_scale k_scale, B = -g s self_scale^2 where |self| > eps (else 0), with
             scale = 1 / max(|row|, eps) and s the cosine;
- gaussian:  A = 2 g e, B = -2 g e, with e = exp(-|q - k|^2);
- l1:        C = -g e, with e = exp(-|q - k|_1);
- chebyshev: C = -g e on the first feature of largest |q - k| only, with e = exp(-|q - k|_inf);
where g is the incoming gradient (0 on masked slots). Three kernels:
1. _pair_coefficients_kernel: one program per block of query rows and one slot; the pair's
   statistics over every feature, in order; writes A, B, C for the query's and the key's side and
   chebyshev's feature;
2. _query_gradient_kernel: one program per block of rows and block of features, the slots in order;
3. _key_gradient_kernel: one program per key row and block of features, its slots in the inverse
   index's order (the launcher's inverse_index): no atomics, so two backward passes are bitwise equal.
As in aggregate.py: each output element written by one program, every load and store masked,
`while` loops for runtime bounds. Accumulation in float32 for float32, bfloat16 and float16 inputs,
float64 for float64.
"""
import triton
import triton.language as tl

from .similarities import CHEBYSHEV, CODES, COSINE, GAUSSIAN, L1, known

ROWS = 16  # with 32 rows, ptxas spilled 16 bytes in the l1 query gradient on sm_80
FEATURES = 32
# The similarities these kernels serve, with their codes (similarities.py); dot and scaled_dot run on
# the aggregation kernels (select_launches.cpp).
SIMILARITY_CODES = {name: CODES[name] for name in ("cosine", "gaussian", "chebyshev", "l1")}


_LINEAR_TERMS = tl.constexpr((CODES["cosine"], CODES["gaussian"]))


@triton.constexpr_function
def _linear_terms(code):
    """Whether a pair's gradient is A * other + B * self (cosine, gaussian), rather than
    C * sign(self - other) (chebyshev, l1): the two forms these kernels know."""
    return known(code) in _LINEAR_TERMS.value


COEFFICIENTS = 6  # A, B, C for the query's side, then for the key's


@triton.jit
def _pair_coefficients_kernel(q_ptr, k_ptr, indices_ptr, live_ptr, coefficients_ptr, arg_ptr,
                              rows_total, n, m, d, k, eps,
                              SIMILARITY: tl.constexpr, ROWS: tl.constexpr, FEATURES: tl.constexpr,
                              ACC: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    slot = tl.program_id(1)
    row_ok = rows < rows_total
    pair = rows.to(tl.int64) * k + slot
    index = tl.load(indices_ptr + pair, mask=row_ok, other=0)
    key_row = (rows // n).to(tl.int64) * m + index
    g = tl.load(live_ptr + pair, mask=row_ok, other=0.0).to(ACC)
    # The statistics, feature blocks in order: dot and squared norms (cosine), the squared or L1
    # distance, or the largest |q - k| and its first feature (chebyshev).
    first_stat = tl.zeros([ROWS], dtype=ACC)
    q_squares = tl.zeros([ROWS], dtype=ACC)
    k_squares = tl.zeros([ROWS], dtype=ACC)
    arg = tl.zeros([ROWS], dtype=tl.int32)
    first = 0
    while first < d:
        features = first + tl.arange(0, FEATURES)
        both_ok = row_ok[:, None] & (features < d)[None, :]
        q = tl.load(q_ptr + rows.to(tl.int64)[:, None] * d + features[None, :], mask=both_ok, other=0.0).to(ACC)
        key = tl.load(k_ptr + key_row[:, None] * d + features[None, :], mask=both_ok, other=0.0).to(ACC)
        if SIMILARITY == COSINE:
            first_stat += tl.sum(q * key, axis=1)
            q_squares += tl.sum(q * q, axis=1)
            k_squares += tl.sum(key * key, axis=1)
        elif SIMILARITY == GAUSSIAN:
            diff = q - key
            first_stat += tl.sum(diff * diff, axis=1)
        elif SIMILARITY == CHEBYSHEV:
            size = tl.where(both_ok, tl.abs(q - key), -1.0)
            block_max = tl.max(size, axis=1)
            block_arg = tl.min(tl.where(size == block_max[:, None], features[None, :], d), axis=1)
            larger = block_max > first_stat  # strictly: an earlier feature keeps a tie
            arg = tl.where(larger | (first == 0), block_arg, arg)
            first_stat = tl.where(larger | (first == 0), block_max, first_stat)
        else:
            tl.static_assert(SIMILARITY == L1)
            first_stat += tl.sum(tl.abs(q - key), axis=1)
        first += FEATURES
    zero = tl.zeros([ROWS], dtype=ACC)
    # (A, B, C) of the query's side, then of the key's.
    if SIMILARITY == COSINE:
        q_norm = tl.sqrt(q_squares)
        k_norm = tl.sqrt(k_squares)
        q_scale = 1.0 / tl.maximum(q_norm, eps)
        k_scale = 1.0 / tl.maximum(k_norm, eps)
        cosine = first_stat * q_scale * k_scale
        q_a = g * q_scale * k_scale
        q_b = tl.where(q_norm > eps, -g * cosine * q_scale * q_scale, zero)
        q_c = zero
        k_a = q_a
        k_b = tl.where(k_norm > eps, -g * cosine * k_scale * k_scale, zero)
        k_c = zero
    elif SIMILARITY == GAUSSIAN:
        q_a = 2.0 * g * tl.exp(-first_stat)
        q_b = -q_a
        q_c = zero
        k_a = q_a
        k_b = q_b
        k_c = zero
    else:  # chebyshev and l1
        tl.static_assert(not _linear_terms(SIMILARITY))
        q_a = zero
        q_b = zero
        q_c = -g * tl.exp(-first_stat)
        k_a = zero
        k_b = zero
        k_c = q_c
    base = pair * 6
    tl.store(coefficients_ptr + base, q_a, mask=row_ok)
    tl.store(coefficients_ptr + base + 1, q_b, mask=row_ok)
    tl.store(coefficients_ptr + base + 2, q_c, mask=row_ok)
    tl.store(coefficients_ptr + base + 3, k_a, mask=row_ok)
    tl.store(coefficients_ptr + base + 4, k_b, mask=row_ok)
    tl.store(coefficients_ptr + base + 5, k_c, mask=row_ok)
    tl.store(arg_ptr + pair, arg, mask=row_ok)


@triton.jit
def _sign(x):
    return tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0))


@triton.jit
def _query_gradient_kernel(q_ptr, k_ptr, indices_ptr, coefficients_ptr, arg_ptr, grad_q_ptr,
                           rows_total, n, m, d, k, SIMILARITY: tl.constexpr, ROWS: tl.constexpr,
                           FEATURES: tl.constexpr, ACC: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    features = tl.program_id(1) * FEATURES + tl.arange(0, FEATURES)
    row_ok = rows < rows_total
    both_ok = row_ok[:, None] & (features < d)[None, :]
    q = tl.load(q_ptr + rows.to(tl.int64)[:, None] * d + features[None, :], mask=both_ok, other=0.0).to(ACC)
    slice_start = (rows // n).to(tl.int64) * m
    acc = tl.zeros([ROWS, FEATURES], dtype=ACC)
    slot = 0
    while slot < k:
        pair = rows.to(tl.int64) * k + slot
        index = tl.load(indices_ptr + pair, mask=row_ok, other=0)
        key = tl.load(k_ptr + (slice_start + index)[:, None] * d + features[None, :], mask=both_ok,
                      other=0.0).to(ACC)
        if _linear_terms(SIMILARITY):  # A * other + B * self
            a = tl.load(coefficients_ptr + pair * 6, mask=row_ok, other=0.0)
            b = tl.load(coefficients_ptr + pair * 6 + 1, mask=row_ok, other=0.0)
            acc += a[:, None] * key + b[:, None] * q
        else:  # C * sign(self - other), chebyshev on its feature only
            c = tl.load(coefficients_ptr + pair * 6 + 2, mask=row_ok, other=0.0)
            term = c[:, None] * _sign(q - key)
            if SIMILARITY == CHEBYSHEV:
                arg = tl.load(arg_ptr + pair, mask=row_ok, other=-1)
                term = tl.where(features[None, :] == arg[:, None], term, 0.0)
            acc += term
        slot += 1
    tl.store(grad_q_ptr + rows.to(tl.int64)[:, None] * d + features[None, :], acc.to(grad_q_ptr.dtype.element_ty),
             mask=both_ok)


@triton.jit
def _key_gradient_kernel(q_ptr, k_ptr, coefficients_ptr, arg_ptr, order_ptr, run_start_ptr, grad_k_ptr,
                         d, k, SIMILARITY: tl.constexpr, FEATURES: tl.constexpr, ACC: tl.constexpr):
    key_row = tl.program_id(0)
    features = tl.program_id(1) * FEATURES + tl.arange(0, FEATURES)
    feature_ok = features < d
    key = tl.load(k_ptr + key_row.to(tl.int64) * d + features, mask=feature_ok, other=0.0).to(ACC)
    position = tl.load(run_start_ptr + key_row)
    end = tl.load(run_start_ptr + key_row + 1)
    acc = tl.zeros([FEATURES], dtype=ACC)
    while position < end:
        # A flattened [G*N*K] slot, within 32 bits (select_fits): int64 division is a long subroutine.
        pair = tl.load(order_ptr + position).to(tl.int32)
        query_row = pair // k
        q = tl.load(q_ptr + query_row.to(tl.int64) * d + features, mask=feature_ok, other=0.0).to(ACC)
        pair = pair.to(tl.int64)  # its six coefficients may lie past 2^31
        if _linear_terms(SIMILARITY):
            a = tl.load(coefficients_ptr + pair * 6 + 3)
            b = tl.load(coefficients_ptr + pair * 6 + 4)
            acc += a * q + b * key
        else:
            c = tl.load(coefficients_ptr + pair * 6 + 5)
            term = c * _sign(key - q)
            if SIMILARITY == CHEBYSHEV:
                term = tl.where(features == tl.load(arg_ptr + pair), term, 0.0)
            acc += term
        position += 1
    tl.store(grad_k_ptr + key_row.to(tl.int64) * d + features, acc.to(grad_k_ptr.dtype.element_ty), mask=feature_ok)
