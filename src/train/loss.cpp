#include "convnn/train/loss.h"

#include <ATen/ATen.h>

namespace convnn::train {

at::Tensor smooth_targets(const at::Tensor& labels, int64_t num_classes, double smoothing,
                          at::ScalarType dtype) {
  TORCH_CHECK(labels.dim() == 1 && labels.scalar_type() == at::kLong,
              "smooth_targets: labels must be int64 [B], got ", labels.scalar_type(), " ", labels.sizes());
  TORCH_CHECK(num_classes >= 1, "smooth_targets: num_classes must be >= 1, got ", num_classes);
  TORCH_CHECK(smoothing >= 0.0 && smoothing < 1.0, "smooth_targets: smoothing must be in [0, 1), got ",
              smoothing);
  const double off = smoothing / static_cast<double>(num_classes);
  auto targets = at::full({labels.size(0), num_classes}, off, labels.options().dtype(dtype));
  return targets.scatter_(1, labels.unsqueeze(1), 1.0 - smoothing + off);
}

at::Tensor soft_target_cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  TORCH_CHECK(logits.dim() == 2 && targets.sizes() == logits.sizes(),
              "soft_target_cross_entropy: logits [B,C] and targets [B,C] must have one shape, got ",
              logits.sizes(), " and ", targets.sizes());
  // float32 at least (bfloat16 logits under autocast), float64 when the model is (--precision float64).
  const auto type = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto log_probabilities = at::log_softmax(logits.to(type), 1);
  return -(targets.to(type) * log_probabilities).sum(1).mean();
}

int64_t correct_top_k(const at::Tensor& logits, const at::Tensor& labels, int64_t k) {
  const int64_t top = std::min<int64_t>(k, logits.size(1));
  const auto predicted = std::get<1>(logits.topk(top, 1));
  return predicted.eq(labels.unsqueeze(1)).any(1).sum().item<int64_t>();
}

}  // namespace convnn::train
