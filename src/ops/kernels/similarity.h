#pragma once
// Each similarity of knn_select is one policy struct: everything a kernel, the cost rules and the
// name tables need to know about it, in one place (docs/adding-a-similarity.md). Host- and
// device-callable and free of torch types, so that the CPU kernels (src/ops/cpu/) and a device's
// kernels instantiate the same structs; src/ops/cuda/policies.cu compiles them with nvcc.
//
// A policy has:
//   kKind, kName        its enum value and the name users write
//   kIsDistance         ranks by -distance and reports exp(-distance) (docs/operator.md)
//   kScalesByInverseNorms
//                       a raw pair value is q.k, and its ranking key (q.k * inverse_norm(q)) *
//                       inverse_norm(k), in that order (cosine: exactly orthogonal rows score
//                       exactly 0); to_ranking_keys then leaves the values as they are
//   kIsDotProduct       the accumulation is q.k, so a GEMM may compute a tile of it
//   accumulate(a, q, k) one feature's step of the raw pair value, from a = 0; V is a scalar or a
//                       kernel's vector type (Arith<V> gives it fmadd, abs and maximum)
//   to_ranking_keys(values, count, d)
//                       turns `count` raw pair values into the keys that rank candidates (larger
//                       is more similar), in place; a row at a time, so a loop-invariant factor is
//                       computed once
//   reported_score(key) the score knn_select reports for an unmasked key
//   add_pair_gradient   out += g * d score / d q (wrt_query) or d score / d k, on raw rows
//   kLinearPairGradient add_pair_gradient adds pair_gradient_coefficient(g, d) times the other
//                       row (the key's for d q, the query's for d k), so a kernel may sum those
//                       rows itself, in the same order of operations
//   cost(shape)         MACs, other FLOPs and comparisons per call (docs/flops.md)
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>

#include "convnn/ops/similarity.h"

namespace convnn::kernels {

// The element-wise operations that policies accumulate with, for scalar types. A kernel with
// vector types specialises Arith for them (src/ops/cpu/vec_arith.h does for at::vec::Vectorized).
template <typename V>
struct Arith {
  C10_HOST_DEVICE static V fmadd(V a, V b, V c) { return a * b + c; }
  C10_HOST_DEVICE static V abs(V x) { return x < V(0) ? -x : x; }
  // NaN-propagating, so that a NaN coordinate reaches the ranking check as a NaN key.
  C10_HOST_DEVICE static V maximum(V a, V b) { return (a != a || a > b) ? a : b; }
};

/// Counts in the units of docs/flops.md (ops::OpCost's fields; kept separate so that device code
/// does not see the public header's host-only helpers).
struct OpCost {
  int64_t macs = 0;
  int64_t other_flops = 0;
  int64_t comparisons = 0;
};

/// One similarity call: N queries and M candidates in H slices (heads), D features over all heads
/// (D/H per slice), K reported scores per query.
struct SimilarityShape {
  int64_t queries = 0;
  int64_t candidates = 0;
  int64_t heads = 1;
  int64_t features = 0;
  int64_t k = 0;
};

namespace detail {

template <typename acc_t>
C10_HOST_DEVICE acc_t dot(const acc_t* a, const acc_t* b, int64_t d) {
  acc_t sum = 0;
  for (int64_t j = 0; j < d; ++j) sum += a[j] * b[j];
  return sum;
}

// Shared by the distance similarities: what a raw distance ranks and reports as.
struct DistanceScores {
  static constexpr bool kIsDistance = true;
  static constexpr bool kLinearPairGradient = false;
  static constexpr bool kScalesByInverseNorms = false;
  static constexpr bool kIsDotProduct = false;
  template <typename acc_t>
  C10_HOST_DEVICE static void to_ranking_keys(acc_t* values, int64_t count, int64_t) {
    for (int64_t c = 0; c < count; ++c) values[c] = -values[c];
  }
  template <typename acc_t>
  C10_HOST_DEVICE static acc_t reported_score(acc_t key) { return std::exp(key); }
};

struct DotScores {
  static constexpr bool kIsDistance = false;
  static constexpr bool kLinearPairGradient = false;
  static constexpr bool kIsDotProduct = true;
  template <typename V>
  C10_HOST_DEVICE static V accumulate(V a, V q, V k) { return Arith<V>::fmadd(q, k, a); }
  template <typename acc_t>
  C10_HOST_DEVICE static acc_t reported_score(acc_t key) { return key; }
};

}  // namespace detail

struct DotSimilarity : detail::DotScores {
  static constexpr Similarity kKind = Similarity::Dot;
  static constexpr const char* kName = "dot";
  static constexpr bool kScalesByInverseNorms = false;
  static constexpr bool kLinearPairGradient = true;
  template <typename acc_t>
  C10_HOST_DEVICE static void to_ranking_keys(acc_t*, int64_t, int64_t) {}
  template <typename acc_t>
  C10_HOST_DEVICE static acc_t pair_gradient_coefficient(acc_t g, int64_t) { return g; }
  template <typename acc_t>
  C10_HOST_DEVICE static void add_pair_gradient(const acc_t* q, const acc_t* k, int64_t d, acc_t g,
                                                bool wrt_query, acc_t* out) {
    const acc_t* other = wrt_query ? k : q;
    const acc_t c = pair_gradient_coefficient(g, d);
    for (int64_t j = 0; j < d; ++j) out[j] += c * other[j];
  }
  static constexpr OpCost cost(const SimilarityShape& s) {
    return {s.queries * s.candidates * s.features, 0, 0};
  }
};

struct ScaledDotSimilarity : detail::DotScores {
  static constexpr Similarity kKind = Similarity::ScaledDot;
  static constexpr const char* kName = "scaled_dot";
  static constexpr bool kScalesByInverseNorms = false;
  template <typename acc_t>
  C10_HOST_DEVICE static void to_ranking_keys(acc_t* values, int64_t count, int64_t d) {
    const acc_t root = std::sqrt(static_cast<acc_t>(d));
    // When sqrt(d) is a power of two (d = 4, 16, 64, 256, ...) its reciprocal is exact, and x / root
    // and x * (1 / root) are the same real number, rounded once: the same key, at a multiply's cost.
    if (std::ldexp(acc_t(1), std::ilogb(root)) == root) {
      const acc_t inverse = acc_t(1) / root;
      for (int64_t c = 0; c < count; ++c) values[c] *= inverse;
      return;
    }
    for (int64_t c = 0; c < count; ++c) values[c] /= root;
  }
  static constexpr bool kLinearPairGradient = true;
  template <typename acc_t>
  C10_HOST_DEVICE static acc_t pair_gradient_coefficient(acc_t g, int64_t d) {
    return g / std::sqrt(static_cast<acc_t>(d));
  }
  template <typename acc_t>
  C10_HOST_DEVICE static void add_pair_gradient(const acc_t* q, const acc_t* k, int64_t d, acc_t g,
                                                bool wrt_query, acc_t* out) {
    DotSimilarity::add_pair_gradient(q, k, d, pair_gradient_coefficient(g, d), wrt_query, out);
  }
  // The 1/sqrt(d) scale, once per score.
  static constexpr OpCost cost(const SimilarityShape& s) {
    return {s.queries * s.candidates * s.features, s.heads * s.queries * s.candidates, 0};
  }
};

// (q.k * (1/max(|q|,eps))) * (1/max(|k|,eps)), from the raw rows, in that order on every path
// (the ATen forms, the fused kernels, the Triton kernels): exactly orthogonal rows score exactly 0,
// and integer-valued rows score the same bits on every path (docs/operator.md, "Ties").
struct CosineSimilarity : detail::DotScores {
  static constexpr Similarity kKind = Similarity::Cosine;
  static constexpr const char* kName = "cosine";
  static constexpr bool kScalesByInverseNorms = true;
  template <typename acc_t>
  C10_HOST_DEVICE static void to_ranking_keys(acc_t*, int64_t, int64_t) {}
  // 1 / max(|row|, eps); NaN stays NaN (the ranking check then sees a NaN key).
  template <typename acc_t>
  C10_HOST_DEVICE static acc_t inverse_norm(const acc_t* row, int64_t d) {
    const acc_t eps = static_cast<acc_t>(kCosineEps), norm = std::sqrt(detail::dot(row, row, d));
    return acc_t(1) / (norm < eps ? eps : norm);
  }
  // d/dq of q/max(|q|,eps): the projection away from q when |q| > eps, 1/eps otherwise.
  template <typename acc_t>
  C10_HOST_DEVICE static void add_pair_gradient(const acc_t* q, const acc_t* k, int64_t d, acc_t g,
                                                bool wrt_query, acc_t* out) {
    const acc_t eps = static_cast<acc_t>(kCosineEps);
    const acc_t q_norm = std::sqrt(detail::dot(q, q, d)), k_norm = std::sqrt(detail::dot(k, k, d));
    const acc_t q_scale = acc_t(1) / (q_norm > eps ? q_norm : eps);
    const acc_t k_scale = acc_t(1) / (k_norm > eps ? k_norm : eps);
    const acc_t s = detail::dot(q, k, d) * q_scale * k_scale;
    const acc_t self_norm = wrt_query ? q_norm : k_norm;
    const acc_t self_scale = wrt_query ? q_scale : k_scale, other_scale = wrt_query ? k_scale : q_scale;
    const acc_t* self = wrt_query ? q : k;
    const acc_t* other = wrt_query ? k : q;
    if (self_norm > eps) {
      for (int64_t j = 0; j < d; ++j) {
        out[j] += g * (other[j] * other_scale - s * self[j] * self_scale) / self_norm;
      }
    } else {
      for (int64_t j = 0; j < d; ++j) out[j] += g * other[j] * other_scale / eps;
    }
  }
  // Plain dot products and squared norms (MACs), a square root and a division per vector and
  // head (the inverse norms), and the two products by them per score.
  static constexpr OpCost cost(const SimilarityShape& s) {
    return {s.queries * s.candidates * s.features + (s.queries + s.candidates) * s.features,
            2 * (s.queries + s.candidates) * s.heads + 2 * s.heads * s.queries * s.candidates, 0};
  }
};

// exp(-|q-k|_2^2), ranked by -|q-k|^2 (the same order, and it never underflows).
struct GaussianSimilarity : detail::DistanceScores {
  static constexpr Similarity kKind = Similarity::Gaussian;
  static constexpr const char* kName = "gaussian";
  template <typename V>
  C10_HOST_DEVICE static V accumulate(V a, V q, V k) {
    const V diff = q - k;
    return Arith<V>::fmadd(diff, diff, a);
  }
  template <typename acc_t>
  C10_HOST_DEVICE static void add_pair_gradient(const acc_t* q, const acc_t* k, int64_t d, acc_t g,
                                                bool wrt_query, acc_t* out) {
    acc_t distance_sq = 0;
    for (int64_t j = 0; j < d; ++j) distance_sq += (q[j] - k[j]) * (q[j] - k[j]);
    const acc_t scale = (wrt_query ? acc_t(-2) : acc_t(2)) * g * std::exp(-distance_sq);
    for (int64_t j = 0; j < d; ++j) out[j] += scale * (q[j] - k[j]);
  }
  // |q|^2 + |k|^2 - 2 q.k: the squared norms, then 3 FLOPs per score; exp only for the K reported.
  static constexpr OpCost cost(const SimilarityShape& s) {
    return {s.queries * s.candidates * s.features + (s.queries + s.candidates) * s.features,
            3 * s.heads * s.queries * s.candidates + s.heads * s.queries * s.k, 0};
  }
};

// exp(-|q-k|_inf), ranked by -|q-k|_inf: on a grid it selects the R x R window.
struct ChebyshevSimilarity : detail::DistanceScores {
  static constexpr Similarity kKind = Similarity::Chebyshev;
  static constexpr const char* kName = "chebyshev";
  template <typename V>
  C10_HOST_DEVICE static V accumulate(V a, V q, V k) {
    return Arith<V>::maximum(a, Arith<V>::abs(q - k));
  }
  // Only the first coordinate of largest |q - k| (as at::max picks) carries the gradient.
  template <typename acc_t>
  C10_HOST_DEVICE static void add_pair_gradient(const acc_t* q, const acc_t* k, int64_t d, acc_t g,
                                                bool wrt_query, acc_t* out) {
    int64_t arg = 0;
    for (int64_t j = 1; j < d; ++j) {
      if (Arith<acc_t>::abs(q[j] - k[j]) > Arith<acc_t>::abs(q[arg] - k[arg])) arg = j;
    }
    const acc_t diff = q[arg] - k[arg];
    const acc_t sign = diff > 0 ? acc_t(1) : (diff < 0 ? acc_t(-1) : acc_t(0));
    out[arg] += (wrt_query ? acc_t(-1) : acc_t(1)) * g * std::exp(-Arith<acc_t>::abs(diff)) * sign;
  }
  // A subtraction and a running-max comparison per feature pair, no products; exp of the K.
  static constexpr OpCost cost(const SimilarityShape& s) {
    return {0, s.queries * s.candidates * s.features + s.heads * s.queries * s.k,
            s.queries * s.candidates * s.features};
  }
};

// exp(-|q-k|_1), ranked by -|q-k|_1 (the Manhattan distance).
struct L1Similarity : detail::DistanceScores {
  static constexpr Similarity kKind = Similarity::L1;
  static constexpr const char* kName = "l1";
  template <typename V>
  C10_HOST_DEVICE static V accumulate(V a, V q, V k) { return a + Arith<V>::abs(q - k); }
  // d|q-k|_1/dq = sign(q-k): each coordinate carries g * exp(-|q-k|_1) * -sign(q-k) to q.
  template <typename acc_t>
  C10_HOST_DEVICE static void add_pair_gradient(const acc_t* q, const acc_t* k, int64_t d, acc_t g,
                                                bool wrt_query, acc_t* out) {
    acc_t distance = 0;
    for (int64_t j = 0; j < d; ++j) distance += Arith<acc_t>::abs(q[j] - k[j]);
    const acc_t scale = (wrt_query ? acc_t(-1) : acc_t(1)) * g * std::exp(-distance);
    for (int64_t j = 0; j < d; ++j) {
      const acc_t diff = q[j] - k[j];
      out[j] += scale * (diff > 0 ? acc_t(1) : (diff < 0 ? acc_t(-1) : acc_t(0)));
    }
  }
  // A subtraction, an absolute value and an addition per feature pair; exp of the K reported.
  static constexpr OpCost cost(const SimilarityShape& s) {
    return {0, 3 * s.queries * s.candidates * s.features + s.heads * s.queries * s.k, 0};
  }
};

/// Calls f(Policy{}) with the policy of `similarity`. The switch has no default, so that a new
/// enum value without a policy fails the build (-Werror=switch).
template <typename F>
decltype(auto) dispatch_similarity(Similarity similarity, F&& f) {
  switch (similarity) {
    case Similarity::Dot: return f(DotSimilarity{});
    case Similarity::ScaledDot: return f(ScaledDotSimilarity{});
    case Similarity::Cosine: return f(CosineSimilarity{});
    case Similarity::Gaussian: return f(GaussianSimilarity{});
    case Similarity::Chebyshev: return f(ChebyshevSimilarity{});
    case Similarity::L1: return f(L1Similarity{});
  }
  TORCH_INTERNAL_ASSERT(false, "dispatch_similarity: no policy for similarity ",
                        static_cast<int>(similarity));
}

/// Calls f(Policy{}) for every similarity, in enum order.
template <typename F>
void for_each_similarity(F&& f) {
  for (int value = 0; value < kSimilarityCount; ++value) {
    dispatch_similarity(static_cast<Similarity>(value), f);
  }
}

}  // namespace convnn::kernels
