// Generic knn_select and its backward (src/ops/generic/generic.h). The forward computes the ranking
// keys of one block of query rows at a time, takes each row's k best with a two-pass top-k that
// lets the lower index win ties, and never holds the [G,N,M] matrix.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "ops/checks.h"
#include "ops/generic/generic.h"
#include "ops/generic/internal.h"
#include "ops/reference/indexing.h"

namespace convnn::ops::generic {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

at::Tensor unit_rows(const at::Tensor& x) {
  return x / at::linalg_vector_norm(x, 2, {-1}, /*keepdim=*/true).clamp_min(kCosineEps);
}

// |x| from ops that have Meta kernels in C++ (at::abs has none).
at::Tensor magnitude(const at::Tensor& x) { return x * x.sign(); }

// The distance between every query of the block and every key, from exact pairwise differences,
// one coordinate at a time: mirror positions tie exactly (the |q|^2 + |k|^2 - 2 q.k expansion does
// not), and only [rows, M] is live, never [rows, M, D]. `chebyshev` takes the largest coordinate,
// otherwise the squares are summed.
at::Tensor pairwise_distance(const at::Tensor& queries, const at::Tensor& keys, bool chebyshev) {
  at::Tensor total;
  for (int64_t d = 0; d < queries.size(2); ++d) {
    auto diff = queries.select(2, d).unsqueeze(2) - keys.select(2, d).unsqueeze(1);
    auto term = chebyshev ? magnitude(diff) : diff.mul_(diff);
    total = !total.defined() ? term : (chebyshev ? at::maximum(total, term) : total.add_(term));
  }
  return total;
}

void apply_mask(at::Tensor& ranking_keys, const at::Tensor& mask, const RowBlock& block) {
  if (!mask.defined()) return;
  const auto rows = mask.dim() == 2 ? mask.narrow(0, block.row, block.rows) : block_of(mask, block);
  if (mask.scalar_type() == at::kBool) {
    ranking_keys.masked_fill_(rows.bitwise_not(), kNegInf);
  } else {
    ranking_keys.add_(rows);
  }
}

// The block's [slices, rows, M] ranking keys (docs/operator.md: larger is more similar, -distance
// for the distance similarities, masked entries -inf), in the accumulation type.
at::Tensor block_ranking_keys(const SelectOperands& in, const RowBlock& block) {
  const auto queries = block_of(in.queries, block);
  const auto keys = in.keys.narrow(0, block.slice, block.slices);
  at::Tensor ranking_keys;
  switch (in.similarity) {
    case Similarity::Dot:
    case Similarity::Cosine: ranking_keys = at::bmm(queries, keys.transpose(1, 2)); break;
    case Similarity::ScaledDot:
      ranking_keys = at::bmm(queries, keys.transpose(1, 2))
                         .div_(std::sqrt(static_cast<double>(queries.size(2))));
      break;
    case Similarity::Gaussian: ranking_keys = pairwise_distance(queries, keys, false).neg_(); break;
    case Similarity::Chebyshev: ranking_keys = pairwise_distance(queries, keys, true).neg_(); break;
  }
  apply_mask(ranking_keys, in.mask, block);
  return ranking_keys;
}

// Positions [..,k] of each row's k largest keys in ascending order, the lower index winning ties.
// at::topk breaks ties arbitrarily, so it only finds the k-th largest key; a second top-k on an
// integer rank picks every key above it (fewer than k, so all of them), then keys equal to it by
// ascending index. Masked (-inf) candidates thus fill short rows lowest index first.
at::Tensor top_k_positions(const at::Tensor& ranking_keys, int64_t k) {
  const int64_t m = ranking_keys.size(-1);
  const auto kth_best =
      std::get<0>(at::topk(ranking_keys, k, -1, /*largest=*/true, /*sorted=*/false)).amin(-1, true);
  // int32 where it holds m + 1: the rank is built and searched about twice as fast as int64.
  const auto rank_type = m < std::numeric_limits<int32_t>::max() ? at::kInt : at::kLong;
  auto rank = (ranking_keys >= kth_best).to(rank_type).mul_(
      at::arange(m, 0, -1, ranking_keys.options().dtype(rank_type)));
  rank.masked_fill_(ranking_keys > kth_best, m + 1);
  const auto positions = std::get<1>(at::topk(rank, k, -1, /*largest=*/true, /*sorted=*/false));
  return std::get<0>(positions.sort(-1));
}

// Scores as knn_select reports them: exp(-distance) for the distance similarities, -inf kept.
at::Tensor reported_scores(const at::Tensor& top_keys, Similarity similarity) {
  if (!is_distance_similarity(similarity)) return top_keys;
  return top_keys.exp().masked_fill_(at::isneginf(top_keys), kNegInf);
}

// d score / d query and d score / d key of each selected pair, [G,N,K,D] (broadcastable), as
// reference::knn_select_backward defines them (chebyshev: the first coordinate of a tie).
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
      const auto s = (q_unit * k_unit).sum(-1, true);
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
      const auto d_q = -(-distance).exp() * diff.sign() * one_hot;
      return {d_q, -d_q};
    }
  }
  TORCH_CHECK(false, "knn_select_backward: unknown similarity");
}

}  // namespace

SelectOperands::SelectOperands(const at::Tensor& queries_in, const at::Tensor& keys_in,
                               const c10::optional<at::Tensor>& mask_in, Similarity similarity_in)
    : similarity(similarity_in) {
  const auto acc = at::toOpMathType(queries_in.scalar_type());
  queries = queries_in.to(acc);
  keys = keys_in.to(acc);
  if (similarity == Similarity::Cosine) {
    queries = unit_rows(queries);
    keys = unit_rows(keys);
  }
  if (mask_in.has_value() && mask_in->defined()) {
    mask = mask_in->scalar_type() == at::kBool ? *mask_in : mask_in->to(acc);
  }
  unrankable = at::zeros({}, queries_in.options().dtype(at::kBool));
}

int64_t select_bytes_per_score(at::ScalarType acc) {
  // The keys, one distance term or mask temporary beside them, the integer rank (int32, or int64
  // for huge M) and its bool tests.
  return 3 * static_cast<int64_t>(c10::elementSize(acc)) + 8 + 4;
}

std::tuple<at::Tensor, at::Tensor> select_block(SelectOperands& in, int64_t k, bool index_order,
                                                const RowBlock& block) {
  const auto ranking_keys = block_ranking_keys(in, block);
  in.unrankable.bitwise_or_(ranking_keys.ne(ranking_keys).bitwise_or_(at::isposinf(ranking_keys)).any());
  auto positions = top_k_positions(ranking_keys, k);
  auto top_keys = ranking_keys.gather(-1, positions);
  if (!index_order) {
    // Stable: equal keys keep ascending index order, so the lower index comes first.
    auto [by_score, permutation] = reference::stable_sort(top_keys, /*descending=*/true);
    top_keys = by_score;
    positions = positions.gather(-1, permutation);
  }
  return {reported_scores(top_keys, in.similarity), positions};
}

void raise_if_unrankable(const SelectOperands& in, const char* op) {
  if (in.unrankable.is_meta()) return;  // a meta tensor has a shape but no values
  // The forward's one host read: an unrankable score must raise, and only the host can.
  if (!in.unrankable.item<bool>()) return;
  // The error path may hold the whole matrix: it names the first bad [g, i, j] as every backend does.
  const RowBlock everything{0, in.queries.size(0), 0, in.queries.size(1)};
  checks::check_rankable(block_ranking_keys(in, everything), op);
  TORCH_INTERNAL_ASSERT(false, op, ": a block met a NaN or +inf score that the whole matrix lacks");
}

std::tuple<at::Tensor, at::Tensor> knn_select(const at::Tensor& queries, const at::Tensor& keys,
                                              int64_t k, c10::string_view similarity_name,
                                              const c10::optional<at::Tensor>& mask,
                                              bool index_order) {
  const auto similarity = checks::check_select_inputs(queries, keys, k, similarity_name, mask);
  const int64_t g = queries.size(0), n = queries.size(1);
  auto scores = at::empty({g, n, k}, queries.options());
  auto indices = at::empty({g, n, k}, queries.options().dtype(at::kLong));
  SelectOperands in(queries, keys, mask, similarity);
  const int64_t bytes_per_row = keys.size(1) * select_bytes_per_score(in.queries.scalar_type());
  for_each_row_block(g, n, bytes_per_row, [&](const RowBlock& block) {
    const auto [block_scores, block_indices] = select_block(in, k, index_order, block);
    block_of(scores, block).copy_(block_scores);
    block_of(indices, block).copy_(block_indices);
  });
  raise_if_unrankable(in, "knn_select");
  return {scores, indices};
}

std::tuple<at::Tensor, at::Tensor> knn_select_backward(const at::Tensor& grad_scores,
                                                       const at::Tensor& queries,
                                                       const at::Tensor& keys,
                                                       const at::Tensor& indices,
                                                       const at::Tensor& scores,
                                                       c10::string_view similarity_name) {
  const auto similarity = checks::check_select_backward_inputs(grad_scores, queries, keys, indices,
                                                               scores, similarity_name);
  // Masked slots have a constant score (-inf): no gradient flows through them.
  const auto live = grad_scores.masked_fill(at::isneginf(scores), 0).unsqueeze(-1);  // [G,N,K,1]
  const auto [d_queries, d_keys] =
      pair_gradients(queries.unsqueeze(2), gather_rows(keys, indices), similarity);
  return {(live * d_queries).sum(2), sum_into_rows(live * d_keys, indices, keys.size(1))};
}

TORCH_LIBRARY_IMPL(convnn, CompositeExplicitAutograd, m) {
  m.impl("knn_select", &knn_select);
  m.impl("knn_select_backward", &knn_select_backward);
}

}  // namespace convnn::ops::generic
