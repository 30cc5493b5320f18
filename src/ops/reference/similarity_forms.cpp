#include "ops/reference/similarity_forms.h"

#include <ATen/ATen.h>
#include <ATen/functorch/DynamicLayer.h>

#include <cmath>
#include <limits>

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

at::Tensor ranking_keys(const at::Tensor& queries, const at::Tensor& keys, Similarity similarity) {
  switch (similarity) {
    case Similarity::Dot: return at::bmm(queries, keys.transpose(1, 2));
    case Similarity::Cosine:
      return at::bmm(queries, keys.transpose(1, 2)) * inverse_norms(queries) * inverse_norms(keys).transpose(1, 2);
    case Similarity::ScaledDot:
      return at::bmm(queries, keys.transpose(1, 2)).div_(std::sqrt(static_cast<double>(queries.size(2))));
    case Similarity::Gaussian: return pairwise_distance(queries, keys, Reduce::SumOfSquares).neg_();
    case Similarity::Chebyshev: return pairwise_distance(queries, keys, Reduce::MaxMagnitude).neg_();
    case Similarity::L1: return pairwise_distance(queries, keys, Reduce::SumOfMagnitudes).neg_();
  }
  TORCH_INTERNAL_ASSERT(false, "ranking_keys: unknown similarity ", static_cast<int>(similarity));
}

at::Tensor reported_scores(const at::Tensor& selected_keys, Similarity similarity) {
  if (!is_distance_similarity(similarity)) return selected_keys;
  // Out of place: exp's backward reads its result.
  return selected_keys.exp().masked_fill(at::isneginf(selected_keys), kNegInf);
}

std::tuple<at::Tensor, at::Tensor> pair_gradients(const at::Tensor& q, const at::Tensor& kk,
                                                  Similarity similarity) {
  switch (similarity) {
    case Similarity::Dot: return {kk, q.expand_as(kk)};
    case Similarity::ScaledDot: {
      const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
      return {kk * scale, q.expand_as(kk) * scale};
    }
    case Similarity::Cosine: {
      const auto q_norm = at::linalg_vector_norm(q, 2, {-1}, true);
      const auto k_norm = at::linalg_vector_norm(kk, 2, {-1}, true);
      const auto q_unit = q / q_norm.clamp_min(kCosineEps);
      const auto k_unit = kk / k_norm.clamp_min(kCosineEps);
      const auto s = (q * kk).sum(-1, true) * inverse_norms(q) * inverse_norms(kk);
      // d/dq of q/max(|q|,eps): the projection away from q when |q| > eps, 1/eps otherwise.
      return {(k_unit - (q_norm > kCosineEps) * s * q_unit) / q_norm.clamp_min(kCosineEps),
              (q_unit - (k_norm > kCosineEps) * s * k_unit) / k_norm.clamp_min(kCosineEps)};
    }
    case Similarity::Gaussian: {
      const auto diff = q - kk;
      const auto d_q = -2.0 * (-diff.square().sum(-1, true)).exp() * diff;
      return {d_q, -d_q};
    }
    case Similarity::Chebyshev: {
      const auto diff = q - kk;
      const auto [distance, first_largest] = magnitude(diff).max(-1, true);
      const auto one_hot = at::zeros_like(diff).scatter_(-1, first_largest, 1.0);
      const auto d_q = sign_of_difference_gradient(diff, distance) * one_hot;
      return {d_q, -d_q};
    }
    case Similarity::L1: {
      const auto diff = q - kk;
      const auto d_q = sign_of_difference_gradient(diff, magnitude(diff).sum(-1, true));
      return {d_q, -d_q};
    }
  }
  TORCH_INTERNAL_ASSERT(false, "pair_gradients: unknown similarity ", static_cast<int>(similarity));
}

}  // namespace convnn::reference
