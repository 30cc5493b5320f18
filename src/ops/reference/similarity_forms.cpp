#include "ops/reference/similarity_forms.h"

#include <ATen/ATen.h>
#include <ATen/functorch/DynamicLayer.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include "ops/kernels/similarity.h"

namespace convnn::reference {
namespace {

// |x| from ops that have Meta kernels in C++ (at::abs has none).
at::Tensor magnitude(const at::Tensor& x) { return x * x.sign(); }

// Whether autograd, forward-mode AD or a torch.func transform tracks `t`: then no op may
// overwrite it in place.
bool is_differentiated(const at::Tensor& t) {
  return t.requires_grad() || t._fw_grad(/*level=*/0).defined() ||
         at::functorch::maybeCurrentDynamicLayer().has_value();
}

enum class Reduce { SumOfSquares, SumOfMagnitudes, MaxMagnitude };

// The distance between every query and every key, from exact pairwise differences one coordinate
// at a time: mirror positions tie exactly (the |q|^2 + |k|^2 - 2 q.k expansion does not), and only
// [G,N,M] is live, never [G,N,M,D]. NaN coordinates stay NaN (maximum propagates them).
at::Tensor pairwise_distance(const at::Tensor& queries, const at::Tensor& keys, Reduce reduce) {
  at::Tensor total;
  for (int64_t d = 0; d < queries.size(2); ++d) {
    auto diff = queries.select(2, d).unsqueeze(2) - keys.select(2, d).unsqueeze(1);
    // In place saves a [G,N,M] allocation per coordinate; differentiation (torch.func, forward
    // mode, double backward: src/ops/autograd/aten_autograd.h) needs the difference kept.
    auto term = reduce != Reduce::SumOfSquares ? magnitude(diff)
                : is_differentiated(diff)      ? diff * diff
                                               : diff.mul_(diff);
    if (!total.defined()) {
      total = term;
    } else {
      total = reduce == Reduce::MaxMagnitude ? at::maximum(total, term) : total.add_(term);
    }
  }
  return total;
}

at::Tensor sign_of_difference_gradient(const at::Tensor& diff, const at::Tensor& distance) {
  return -(-distance).exp() * diff.sign();
}

}  // namespace

at::Tensor inverse_norms(const at::Tensor& x) {
  return at::linalg_vector_norm(x, 2, {-1}, /*keepdim=*/true).clamp_min(kCosineEps).reciprocal();
}

namespace {

using Gradients = std::tuple<at::Tensor, at::Tensor>;

// Each similarity's whole-tensor forms, one specialisation per policy of ops/kernels/similarity.h
// (the policy's element-by-element rules, as ATen computes them): dispatch_similarity is the only
// switch, and a similarity without forms here fails to compile.
//   ranking_keys(queries [G,N,D], keys [G,M,D]) -> [G,N,M]   the key that ranks candidates
//   pair_scores(q [..,1,D], kk [..,K,D]) -> [..,K]           the score knn_select reports
//   pair_gradients(q, kk) -> (d score/d q, d score/d k)       on raw rows, broadcastable
template <typename Policy>
struct WholeTensorForms;

template <>
struct WholeTensorForms<kernels::DotSimilarity> {
  static at::Tensor ranking_keys(const at::Tensor& queries, const at::Tensor& keys) {
    return at::bmm(queries, keys.transpose(1, 2));
  }
  static at::Tensor pair_scores(const at::Tensor& q, const at::Tensor& kk) { return (q * kk).sum(-1); }
  static Gradients pair_gradients(const at::Tensor& q, const at::Tensor& kk) { return {kk, q.expand_as(kk)}; }
};

template <>
struct WholeTensorForms<kernels::ScaledDotSimilarity> {
  static double root(const at::Tensor& x) { return std::sqrt(static_cast<double>(x.size(-1))); }
  static at::Tensor ranking_keys(const at::Tensor& queries, const at::Tensor& keys) {
    return at::bmm(queries, keys.transpose(1, 2)).div_(root(queries));
  }
  static at::Tensor pair_scores(const at::Tensor& q, const at::Tensor& kk) { return (q * kk).sum(-1) / root(q); }
  static Gradients pair_gradients(const at::Tensor& q, const at::Tensor& kk) {
    const double scale = 1.0 / root(q);
    return {kk * scale, q.expand_as(kk) * scale};
  }
};

template <>
struct WholeTensorForms<kernels::CosineSimilarity> {
  static at::Tensor ranking_keys(const at::Tensor& queries, const at::Tensor& keys) {
    return at::bmm(queries, keys.transpose(1, 2)) * inverse_norms(queries) * inverse_norms(keys).transpose(1, 2);
  }
  static at::Tensor pair_scores(const at::Tensor& q, const at::Tensor& kk) {
    return (q * kk).sum(-1) * inverse_norms(q).squeeze(-1) * inverse_norms(kk).squeeze(-1);
  }
  static Gradients pair_gradients(const at::Tensor& q, const at::Tensor& kk) {
    const auto q_norm = at::linalg_vector_norm(q, 2, {-1}, true);
    const auto k_norm = at::linalg_vector_norm(kk, 2, {-1}, true);
    const auto q_unit = q / q_norm.clamp_min(kCosineEps);
    const auto k_unit = kk / k_norm.clamp_min(kCosineEps);
    const auto s = (q * kk).sum(-1, true) * inverse_norms(q) * inverse_norms(kk);
    // d/dq of q/max(|q|,eps): the projection away from q when |q| > eps, 1/eps otherwise.
    return {(k_unit - (q_norm > kCosineEps) * s * q_unit) / q_norm.clamp_min(kCosineEps),
            (q_unit - (k_norm > kCosineEps) * s * k_unit) / k_norm.clamp_min(kCosineEps)};
  }
};

template <>
struct WholeTensorForms<kernels::GaussianSimilarity> {
  static at::Tensor ranking_keys(const at::Tensor& queries, const at::Tensor& keys) {
    return pairwise_distance(queries, keys, Reduce::SumOfSquares).neg_();
  }
  static at::Tensor pair_scores(const at::Tensor& q, const at::Tensor& kk) {
    return (-(q - kk).square().sum(-1)).exp();
  }
  static Gradients pair_gradients(const at::Tensor& q, const at::Tensor& kk) {
    const auto diff = q - kk;
    const auto d_q = -2.0 * (-diff.square().sum(-1, true)).exp() * diff;
    return {d_q, -d_q};
  }
};

template <>
struct WholeTensorForms<kernels::ChebyshevSimilarity> {
  static at::Tensor ranking_keys(const at::Tensor& queries, const at::Tensor& keys) {
    return pairwise_distance(queries, keys, Reduce::MaxMagnitude).neg_();
  }
  // The distance read at the first largest coordinate, not amax: at a tie the gradient goes to
  // that coordinate alone, as in the fused kernels (amax would split it among the tied ones).
  static at::Tensor pair_scores(const at::Tensor& q, const at::Tensor& kk) {
    const auto magnitudes = (q - kk).abs();
    return (-magnitudes.gather(-1, magnitudes.argmax(-1, /*keepdim=*/true)).squeeze(-1)).exp();
  }
  static Gradients pair_gradients(const at::Tensor& q, const at::Tensor& kk) {
    const auto diff = q - kk;
    const auto [distance, first_largest] = magnitude(diff).max(-1, true);
    const auto one_hot = at::zeros_like(diff).scatter_(-1, first_largest, 1.0);
    const auto d_q = sign_of_difference_gradient(diff, distance) * one_hot;
    return {d_q, -d_q};
  }
};

template <>
struct WholeTensorForms<kernels::L1Similarity> {
  static at::Tensor ranking_keys(const at::Tensor& queries, const at::Tensor& keys) {
    return pairwise_distance(queries, keys, Reduce::SumOfMagnitudes).neg_();
  }
  static at::Tensor pair_scores(const at::Tensor& q, const at::Tensor& kk) { return (-(q - kk).abs().sum(-1)).exp(); }
  static Gradients pair_gradients(const at::Tensor& q, const at::Tensor& kk) {
    const auto diff = q - kk;
    const auto d_q = sign_of_difference_gradient(diff, magnitude(diff).sum(-1, true));
    return {d_q, -d_q};
  }
};

template <typename Policy>
using FormsOf = WholeTensorForms<std::decay_t<Policy>>;

}  // namespace

at::Tensor ranking_keys(const at::Tensor& queries, const at::Tensor& keys, Similarity similarity) {
  return kernels::dispatch_similarity(
      similarity, [&](auto policy) { return FormsOf<decltype(policy)>::ranking_keys(queries, keys); });
}

at::Tensor pair_scores(const at::Tensor& q, const at::Tensor& kk, Similarity similarity) {
  return kernels::dispatch_similarity(similarity,
                                      [&](auto policy) { return FormsOf<decltype(policy)>::pair_scores(q, kk); });
}

at::Tensor reported_scores(const at::Tensor& selected_keys, Similarity similarity) {
  if (!is_distance_similarity(similarity)) return selected_keys;
  // Out of place: exp's backward reads its result.
  return selected_keys.exp().masked_fill(at::isneginf(selected_keys), kNegInf);
}

std::tuple<at::Tensor, at::Tensor> pair_gradients(const at::Tensor& q, const at::Tensor& kk,
                                                  Similarity similarity) {
  return kernels::dispatch_similarity(similarity,
                                      [&](auto policy) { return FormsOf<decltype(policy)>::pair_gradients(q, kk); });
}

}  // namespace convnn::reference
