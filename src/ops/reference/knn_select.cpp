// Reference knn_select: the full [G,N,M] similarity matrix (the ATen forms of
// ops/reference/similarity_forms.h), a stable descending sort (so the lower index wins ties) and the
// first k columns. Its backward recomputes only the k selected scores.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "ops/reference/similarity_forms.h"
#include "ops/checks.h"
#include "ops/mask_slices.h"
#include "ops/reference/indexing.h"
#include "ops/reference/reference.h"

namespace convnn::reference {
namespace {

at::Tensor apply_mask(at::Tensor keys_matrix, const c10::optional<at::Tensor>& mask) {
  if (!mask.has_value() || !mask->defined()) return keys_matrix;
  const auto every_slice = ops::mask_of_every_slice(*mask, keys_matrix.size(0));
  if (every_slice.scalar_type() == at::kBool) {
    return at::where(every_slice, keys_matrix, at::scalar_tensor(kNegInf, keys_matrix.options()));
  }
  return keys_matrix + every_slice.to(keys_matrix.scalar_type());
}

}  // namespace

at::Tensor ranking_keys(const at::Tensor& queries, const at::Tensor& keys, Similarity similarity,
                        const c10::optional<at::Tensor>& mask) {
  return apply_mask(reference::ranking_keys(queries, keys, similarity), mask);
}

at::Tensor selected_scores(const at::Tensor& queries, const at::Tensor& keys,
                           const at::Tensor& indices, Similarity similarity) {
  return reference::pair_scores(queries.unsqueeze(2), gather_rows(keys, indices), similarity);  // [G,N,K]
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
  return {reference::reported_scores(top_keys, similarity).contiguous(), top_indices.contiguous()};
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
  const auto [d_q, d_k] =                                             // per slot, [G,N,K,D]
      reference::pair_gradients(queries.unsqueeze(2), gather_rows(keys, indices), similarity);
  const auto grad_queries = (g * d_q).sum(2);
  const auto grad_keys = scatter_rows(g * d_k, indices, keys.size(1));
  return {grad_queries, grad_keys};
}

}  // namespace convnn::reference
