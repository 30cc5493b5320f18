// Generic knn_select and its backward (src/ops/generic/generic.h). The forward computes the ranking
// keys of one block of query rows at a time, takes each row's k best with a two-pass top-k that
// lets the lower index win ties, and never holds the [G,N,M] matrix.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "ops/reference/similarity_forms.h"
#include "ops/checks.h"
#include "ops/generic/generic.h"
#include "ops/generic/internal.h"
#include "ops/mask_slices.h"
#include "ops/reference/indexing.h"

namespace convnn::ops::generic {
namespace {

using reference::kNegInf;

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
  auto ranking_keys = reference::ranking_keys(queries, keys, in.similarity);
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

}  // namespace

SelectOperands::SelectOperands(const at::Tensor& queries_in, const at::Tensor& keys_in,
                               const c10::optional<at::Tensor>& mask_in, Similarity similarity_in)
    : similarity(similarity_in) {
  const auto acc = at::toOpMathType(queries_in.scalar_type());
  queries = queries_in.to(acc);
  keys = keys_in.to(acc);
  if (mask_in.has_value() && mask_in->defined()) {
    const auto every_slice = ops::mask_of_every_slice(*mask_in, queries_in.size(0));
    mask = every_slice.scalar_type() == at::kBool ? every_slice : every_slice.to(acc);
  }
  unrankable_rows = at::zeros({queries_in.size(0), queries_in.size(1)}, queries_in.options().dtype(at::kBool));
}

int64_t select_bytes_per_score(at::ScalarType acc) {
  // The keys, one distance term or mask temporary beside them, the integer rank (int32, or int64
  // for huge M) and its bool tests.
  return 3 * static_cast<int64_t>(c10::elementSize(acc)) + 8 + 4;
}

std::tuple<at::Tensor, at::Tensor> select_block(SelectOperands& in, int64_t k, bool index_order,
                                                const RowBlock& block) {
  const auto ranking_keys = block_ranking_keys(in, block);
  block_of(in.unrankable_rows, block)
      .copy_(ranking_keys.ne(ranking_keys).bitwise_or_(at::isposinf(ranking_keys)).any(-1));
  auto positions = top_k_positions(ranking_keys, k);
  auto top_keys = ranking_keys.gather(-1, positions);
  if (!index_order) {
    // Stable: equal keys keep ascending index order, so the lower index comes first.
    auto [by_score, permutation] = reference::stable_sort(top_keys, /*descending=*/true);
    top_keys = by_score;
    positions = positions.gather(-1, permutation);
  }
  return {reference::reported_scores(top_keys, in.similarity), positions};
}

void settle_unrankable_rows(const SelectOperands& in, const char* op,
                            std::initializer_list<at::Tensor> row_outputs) {
  const auto& rows = in.unrankable_rows;
  if (rows.is_meta()) return;  // a meta tensor has a shape but no values
  if (!checks::reads_values_of(rows)) {
    for (auto output : row_outputs) {
      auto row_shape = rows.sizes().vec();
      row_shape.resize(output.dim(), 1);
      output.masked_fill_(rows.view(row_shape), std::numeric_limits<double>::quiet_NaN());
    }
    return;
  }
  // The forward's one host read where reading is cheap or asked for.
  if (!rows.any().item<bool>()) return;
  // The error path may hold the whole matrix: it names the first bad [g, i, j] as every backend does.
  const RowBlock everything{0, in.queries.size(0), 0, in.queries.size(1)};
  checks::check_rankable(block_ranking_keys(in, everything), op);
  TORCH_INTERNAL_ASSERT(false, op, ": a block met a NaN or +inf score that the whole matrix lacks");
}

std::tuple<at::Tensor, at::Tensor> knn_select_checked(const Similarity& similarity, const at::Tensor& queries,
                                                      const at::Tensor& keys, int64_t k, c10::string_view,
                                                      const c10::optional<at::Tensor>& mask, bool index_order) {
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
  settle_unrankable_rows(in, "knn_select", {scores});
  return {scores, indices};
}

std::tuple<at::Tensor, at::Tensor> knn_select_backward_checked(const Similarity& similarity,
                                                               const at::Tensor& grad_scores,
                                                               const at::Tensor& queries, const at::Tensor& keys,
                                                               const at::Tensor& indices, const at::Tensor& scores,
                                                               c10::string_view) {
  // Masked slots have a constant score (-inf): no gradient flows through them.
  const auto live = grad_scores.masked_fill(at::isneginf(scores), 0).unsqueeze(-1);  // [G,N,K,1]
  // Per block of query rows, so that the per-slot [rows,K,D] tensors (the gathered keys, the pair
  // gradients, their products, the inverse index's copies) stay within the block budget; the key
  // gradient's block sums are added in block order (deterministic).
  const int64_t k = indices.size(2);
  const int64_t element = c10::elementSize(at::toOpMathType(queries.scalar_type()));
  const int64_t bytes_per_row = 6 * k * queries.size(2) * element + 4 * k * static_cast<int64_t>(sizeof(int64_t));
  if (queries.size(0) == 0 || queries.size(1) == 0) {  // no rows to block: zero gradients
    return {at::zeros(queries.sizes(), queries.options()), at::zeros(keys.sizes(), keys.options())};
  }
  BlockedGradient grad_queries, grad_keys;
  for_each_row_block(queries.size(0), queries.size(1), bytes_per_row, [&](const RowBlock& block) {
    const auto block_indices = block_of(indices, block);
    const auto block_live = block_of(live, block);
    const auto block_keys = keys.narrow(0, block.slice, block.slices);
    const auto [d_queries, d_keys] = reference::pair_gradients(
        block_of(queries, block).unsqueeze(2), gather_rows(block_keys, block_indices), similarity);
    grad_queries.copy_rows((block_live * d_queries).sum(2), queries, block);
    grad_keys.add_slices(sum_into_rows(block_live * d_keys, block_indices, keys.size(1)), keys, block);
  });
  return {grad_queries.result(), grad_keys.result()};
}

TORCH_LIBRARY_IMPL(convnn, CompositeExplicitAutograd, m) {
  op::implement<op::KnnSelect>(m, knn_select);
  op::implement<op::KnnSelectBackward>(m, knn_select_backward);
}

}  // namespace convnn::ops::generic
