#pragma once
// The safety net where the Triton kernels meet a real GPU (they are proven on CPU tensors under
// Triton's interpreter and have their launches checked here, but never run in CI): each kernel,
// over the route that would serve the call (routes.h), against the device-generic path on a small
// random input, once per device, dtype and route (path_choice.cpp).
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

#include "ops/cuda/triton/kernel_arguments.h"

namespace convnn::ops::cuda::triton {

/// The first kernel (and what of it) that disagrees with the generic path on `device`, or nothing
/// when all agree: the aggregation forward and backward (depthwise and standard), knn_select on
/// integer-valued features (the same indices, ties included) and its backward (a dot product, a
/// cosine and a chebyshev: the three code paths of the backward kernels), and the fused
/// knn_attention (a dot product and a distance, softmax, a mask, index order) and its backward, each
/// launched by `run`.
std::optional<std::string> first_call_check(const c10::Device& device, at::ScalarType dtype, const LaunchRunner& run);

}  // namespace convnn::ops::cuda::triton
