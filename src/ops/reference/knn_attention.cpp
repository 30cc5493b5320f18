// Reference knn_attention: the reference select, rho and the reference aggregation, composed in
// plain ATen. The fused op is tested against this (and against the composition of the fused ops).
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include <limits>

#include "ops/reference/reference.h"

namespace convnn::reference {

at::Tensor rho_weights(const at::Tensor& scores, Rho rho, double temperature) {
  const auto valid = ~at::isneginf(scores);
  switch (rho) {
    case Rho::Uniform: return valid.to(scores.scalar_type());
    case Rho::Mean: {
      const auto w = valid.to(scores.scalar_type());
      return w / w.sum(-1, true).clamp_min(1.0);
    }
    case Rho::Softmax: {
      // at::softmax, not exp/sum by hand: besides being one kernel, it avoids torch's MKL-VML exp,
      // which after at::scaled_dot_product_attention can run at reduced accuracy on an OpenMP
      // worker thread (docs/operator.md, "Known upstream issues"). Masked slots enter as -inf and
      // come out exactly 0; a row with no valid slot is softmaxed as zeros and then zeroed, so
      // neither the forward nor the backward meets inf - inf or 0/0.
      // The largest valid score is subtracted before the division by the temperature, in the
      // accumulation type (float for half and bfloat16), as the kernels do: the exponents are then
      // <= 0, so a tiny temperature gives the hard max instead of inf - inf. The shift does not
      // change the softmax, so it carries no gradient.
      constexpr double neg_inf = -std::numeric_limits<double>::infinity();
      const auto accumulated = scores.to(at::toOpMathType(scores.scalar_type()));
      const auto row_has_valid = valid.any(-1, /*keepdim=*/true);
      const auto largest = accumulated.amax(-1, /*keepdim=*/true).detach();
      const auto z = at::where(valid, (accumulated - largest) / temperature,
                               at::full({}, neg_inf, accumulated.options()));
      const auto w = at::softmax(at::where(row_has_valid, z, at::zeros_like(z)), -1);
      return at::where(valid, w, at::zeros_like(w)).to(scores.scalar_type());
    }
  }
  TORCH_CHECK(false, "rho_weights: unknown rho");
}

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
