#include "ops/reference/rho_forms.h"

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include <limits>

namespace convnn::reference {

at::Tensor rho_weights(const at::Tensor& scores, Rho rho, double temperature) {
  const auto masked = at::isneginf(scores);
  switch (rho) {
    case Rho::Uniform: return masked.bitwise_not().to(scores.scalar_type());
    case Rho::Mean: {
      const auto w = masked.bitwise_not().to(scores.scalar_type());
      return w / w.sum(-1, true).clamp_min(1.0);
    }
    case Rho::Softmax: {
      // at::softmax, not exp/sum by hand: besides being one kernel, it avoids torch's MKL-VML exp,
      // which after at::scaled_dot_product_attention can run at reduced accuracy on an OpenMP
      // worker thread (docs/operator.md, "Known upstream issues"). The largest valid score is
      // subtracted before the division by the temperature, in the accumulation type (float for
      // half and bfloat16), as the kernels do: the exponents are then <= 0, so a tiny temperature
      // gives the hard max instead of inf - inf. The shift does not change the softmax, so it
      // carries no gradient. Masked slots enter as -inf and come out exactly 0; a row with no valid
      // slot is softmaxed as zeros and then zeroed, so nothing meets inf - inf or 0/0.
      const auto accumulated = scores.to(at::toOpMathType(scores.scalar_type()));
      const auto row_has_valid = masked.bitwise_not().any(-1, /*keepdim=*/true);
      const auto largest = accumulated.amax(-1, /*keepdim=*/true).detach();
      auto z = ((accumulated - largest) / temperature)
                   .masked_fill(masked, -std::numeric_limits<double>::infinity())
                   .masked_fill(row_has_valid.bitwise_not(), 0.0);
      return at::softmax(z, -1).masked_fill(masked, 0.0).to(scores.scalar_type());
    }
  }
  TORCH_INTERNAL_ASSERT(false, "rho_weights: unknown rho ", static_cast<int>(rho));
}

bool nan_scores_give_nan_weights(Rho rho) { return rho == Rho::Softmax; }

}  // namespace convnn::reference
