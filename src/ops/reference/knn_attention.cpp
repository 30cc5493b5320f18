// Reference knn_attention: the reference select, rho and the reference aggregation, composed in
// plain ATen. The fused op is tested against this (and against the composition of the fused ops).
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include "ops/reference/rho_forms.h"
#include "ops/reference/reference.h"

namespace convnn::reference {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention(
    const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
    const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k,
    Similarity similarity, const c10::optional<at::Tensor>& mask, bool index_order, Rho rho,
    double temperature) {
  auto [scores, indices] = knn_select(queries, keys, k, similarity, mask, index_order);
  auto weights = rho_weights(scores, rho, temperature);
  auto output = knn_aggregate(values, weights, indices, kernel, bias);
  return {output, scores, indices, weights};
}

}  // namespace convnn::reference
