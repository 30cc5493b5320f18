#pragma once
// The safety net where the embedded kernels meet a real GPU (they are proven on CPU tensors under
// Triton's interpreter and have their launches checked here, but never run in CI): each kernel
// against the device-generic path on a small random input, once per device and dtype.
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

namespace convnn::ops::cuda::triton {

/// The first kernel (and what of it) that disagrees with the generic path on `device`, or nothing
/// when all agree: the aggregation forward and backward (depthwise and standard), knn_select on
/// integer-valued features (the same indices, ties included) and its backward (a dot product, a
/// cosine and a chebyshev: the three code paths of the backward kernels), and the fused
/// knn_attention (a dot product and a distance, softmax, a mask, index order).
std::optional<std::string> first_call_check(const c10::Device& device, at::ScalarType dtype);

}  // namespace convnn::ops::cuda::triton
