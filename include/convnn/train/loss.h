#pragma once
// Classification losses and accuracy.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace convnn::train {

/// Soft targets from class labels: 1 - smoothing + smoothing / C on the label, smoothing / C
/// elsewhere. labels int64 [B] -> [B,C] in the dtype given.
at::Tensor smooth_targets(const at::Tensor& labels, int64_t num_classes, double smoothing,
                          at::ScalarType dtype = at::kFloat);

/// Mean over the batch of -sum_c target_c * log_softmax(logits)_c, computed in float32.
/// logits [B,C]; targets [B,C] (rows summing to 1).
at::Tensor soft_target_cross_entropy(const at::Tensor& logits, const at::Tensor& targets);

/// Number of rows whose label is among the `k` largest logits.
int64_t correct_top_k(const at::Tensor& logits, const at::Tensor& labels, int64_t k);

}  // namespace convnn::train
