// Reference knn_select: the full [G,N,M] similarity matrix, a stable descending sort (so the lower
// index wins ties) and the first k columns. Its backward recomputes only the k selected scores.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "ops/checks.h"
#include "ops/reference/indexing.h"
#include "ops/reference/reference.h"

namespace convnn::reference {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

at::Tensor unit_rows(const at::Tensor& x) {
  return x / at::linalg_vector_norm(x, 2, {-1}, /*keepdim=*/true).clamp_min(kCosineEps);
}

at::Tensor apply_mask(at::Tensor keys_matrix, const c10::optional<at::Tensor>& mask) {
  if (!mask.has_value() || !mask->defined()) return keys_matrix;
  if (mask->scalar_type() == at::kBool) {
    return at::where(*mask, keys_matrix, at::scalar_tensor(kNegInf, keys_matrix.options()));
  }
  return keys_matrix + mask->to(keys_matrix.scalar_type());
}

// Reports exp(-distance) for distance similarities, keeping -inf for masked slots.
at::Tensor scores_from_keys(const at::Tensor& selected_keys, Similarity similarity) {
  if (!is_distance_similarity(similarity)) return selected_keys;
  return at::where(at::isneginf(selected_keys), selected_keys, selected_keys.exp());
}

}  // namespace

at::Tensor ranking_keys(const at::Tensor& queries, const at::Tensor& keys, Similarity similarity,
                        const c10::optional<at::Tensor>& mask) {
  at::Tensor s;
  switch (similarity) {
    case Similarity::Dot: s = at::bmm(queries, keys.transpose(1, 2)); break;
    case Similarity::ScaledDot:
      s = at::bmm(queries, keys.transpose(1, 2)) / std::sqrt(static_cast<double>(queries.size(2)));
      break;
    case Similarity::Cosine: s = at::bmm(unit_rows(queries), unit_rows(keys).transpose(1, 2)); break;
    // compute_mode 2: exact pairwise differences, never the |q|^2+|k|^2-2qk expansion, so that
    // mirror-image neighbours tie exactly and the lower index wins.
    case Similarity::Gaussian: s = -at::cdist(queries, keys, 2.0, 2).square(); break;
    case Similarity::Chebyshev: {
      // cdist's infinity norm skips NaN coordinates; put the NaN back so check_rankable sees it.
      const auto nan_pair = at::isnan(queries).any(-1).unsqueeze(2) | at::isnan(keys).any(-1).unsqueeze(1);
      s = -at::cdist(queries, keys, std::numeric_limits<double>::infinity());
      s = s.masked_fill(nan_pair, std::numeric_limits<double>::quiet_NaN());
      break;
    }
  }
  return apply_mask(s, mask);
}

at::Tensor selected_scores(const at::Tensor& queries, const at::Tensor& keys,
                           const at::Tensor& indices, Similarity similarity) {
  const auto q = queries.unsqueeze(2);         // [G,N,1,D]
  const auto kk = gather_rows(keys, indices);  // [G,N,K,D]
  switch (similarity) {
    case Similarity::Dot: return (q * kk).sum(-1);
    case Similarity::ScaledDot: return (q * kk).sum(-1) / std::sqrt(static_cast<double>(queries.size(2)));
    case Similarity::Cosine: return (unit_rows(q) * unit_rows(kk)).sum(-1);
    case Similarity::Gaussian: return (-(q - kk).square().sum(-1)).exp();
    case Similarity::Chebyshev: return (-(q - kk).abs().amax(-1)).exp();
  }
  TORCH_CHECK(false, "selected_scores: unknown similarity");
}

std::tuple<at::Tensor, at::Tensor> knn_select(const at::Tensor& queries, const at::Tensor& keys,
                                              int64_t k, Similarity similarity,
                                              const c10::optional<at::Tensor>& mask,
                                              bool index_order) {
  const auto keys_matrix = ranking_keys(queries, keys, similarity, mask);
  checks::check_rankable(keys_matrix, "knn_select");
  auto [sorted, order] = stable_sort(keys_matrix, /*descending=*/true);
  auto top_keys = sorted.narrow(-1, 0, k);
  auto top_indices = order.narrow(-1, 0, k);
  if (index_order) {
    auto [by_index, permutation] = stable_sort(top_indices, /*descending=*/false);
    top_keys = top_keys.gather(-1, permutation);
    top_indices = by_index;
  }
  return {scores_from_keys(top_keys, similarity).contiguous(), top_indices.contiguous()};
}

std::tuple<at::Tensor, at::Tensor> knn_select_backward(const at::Tensor& grad_scores,
                                                       const at::Tensor& queries,
                                                       const at::Tensor& keys,
                                                       const at::Tensor& indices,
                                                       const at::Tensor& scores,
                                                       Similarity similarity) {
  // Masked slots have a constant score (-inf): no gradient flows through them.
  const auto g = at::where(at::isneginf(scores), at::zeros_like(grad_scores), grad_scores)
                     .unsqueeze(-1);                                  // [G,N,K,1]
  const auto q = queries.unsqueeze(2);                                // [G,N,1,D]
  const auto kk = gather_rows(keys, indices);                         // [G,N,K,D]
  at::Tensor d_q, d_k;                                                // per slot, [G,N,K,D]
  switch (similarity) {
    case Similarity::Dot: d_q = kk; d_k = q.expand_as(kk); break;
    case Similarity::ScaledDot: {
      const double scale = 1.0 / std::sqrt(static_cast<double>(queries.size(2)));
      d_q = kk * scale;
      d_k = q.expand_as(kk) * scale;
      break;
    }
    case Similarity::Cosine: {
      const auto q_norm = at::linalg_vector_norm(q, 2, {-1}, true);
      const auto k_norm = at::linalg_vector_norm(kk, 2, {-1}, true);
      const auto q_unit = q / q_norm.clamp_min(kCosineEps);
      const auto k_unit = kk / k_norm.clamp_min(kCosineEps);
      const auto s = (q_unit * k_unit).sum(-1, true);
      // d/dq of q/max(|q|,eps): the projection away from q when |q| > eps, 1/eps otherwise.
      d_q = at::where(q_norm > kCosineEps, (k_unit - s * q_unit) / q_norm, k_unit / kCosineEps);
      d_k = at::where(k_norm > kCosineEps, (q_unit - s * k_unit) / k_norm, q_unit / kCosineEps);
      break;
    }
    case Similarity::Gaussian: {
      const auto diff = q - kk;
      const auto e = (-diff.square().sum(-1, true)).exp();
      d_q = -2.0 * e * diff;
      d_k = 2.0 * e * diff;
      break;
    }
    case Similarity::Chebyshev: {
      const auto diff = q - kk;
      auto [dist, arg] = diff.abs().max(-1, true);
      const auto e = (-dist).exp();
      const auto one_hot = at::zeros_like(diff).scatter_(-1, arg, 1.0);
      d_q = -e * diff.sign() * one_hot;
      d_k = -d_q;
      break;
    }
  }
  const auto grad_queries = (g * d_q).sum(2);
  const auto grad_keys = scatter_rows(g * d_k, indices, keys.size(1));
  return {grad_queries, grad_keys};
}

}  // namespace convnn::reference
