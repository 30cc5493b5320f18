#pragma once
// The host side of the knn_aggregate Triton kernels: the launches that python/convnn/_triton/
// aggregate.py's kernels take, with their grids and arguments: the one launch code of both routes
// (routes.h). Each launch goes through a LaunchRunner; tests pass one that records the launches, so every
// line here runs and is checked against the compiled kernels' parameter lists on a machine with
// no GPU (tests/ops/triton_aot_test.cpp).
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <array>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/cuda/triton/blocks.h"
#include "ops/cuda/triton/kernel_arguments.h"

namespace convnn::ops::cuda::triton {

/// Whether the kernels take these (checked) inputs: every size and every grid within what their
/// 32-bit arguments and CUDA's grid limits allow (the dtype is path_choice.h's rule).
bool aggregate_fits(const at::Tensor& values, const at::Tensor& weights, const at::Tensor& kernel);
/// The key of every aggregation kernel for `dtype` (float32, bfloat16 or float16).
const std::vector<std::string>& aggregate_kernel_keys(at::ScalarType dtype);
/// The name the keys of a kernel compiled per dtype end in: "float32", "bfloat16" or "float16"
/// (specialisations.py's POINTER); an internal error for any other dtype.
const char* kernel_dtype_name(at::ScalarType dtype);
/// keys_of(dtype) for each of the three dtypes the kernels take, built once: the entry for `dtype`.
/// keys_of is a lambda, whose type is its own: the three lists are static per type of KeysOf.
template <typename KeysOf>
const std::vector<std::string>& keys_per_dtype(at::ScalarType dtype, KeysOf keys_of) {
  static const std::vector<std::string> float32 = keys_of(at::kFloat), bfloat16 = keys_of(at::kBFloat16),
                                        float16 = keys_of(at::kHalf);
  kernel_dtype_name(dtype);  // checks the dtype
  return dtype == at::kFloat ? float32 : dtype == at::kBFloat16 ? bfloat16 : float16;
}

// As convnn::knn_aggregate and knn_aggregate_backward, for inputs that the caller checked and made
// contiguous (kernel [C,K] or [C',C,K], bias undefined or [C']), every size within 32 bits.
at::Tensor aggregate_forward(const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
                             const at::Tensor& kernel, const at::Tensor& bias,
                             const LaunchRunner& run);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> aggregate_backward(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
    const at::Tensor& kernel, std::array<bool, 4> output_mask, const LaunchRunner& run);

/// (order, run_start), int32 (every launcher's fits rule bounds G*N*K and G*M below 2^31): the G*N*K
/// slots sorted stably by the values row they read (g*M + index; every index in [0, M)), and where each
/// of the G*M rows' runs starts (G*M + 1 entries). No host synchronisation.
std::pair<at::Tensor, at::Tensor> inverse_index(const at::Tensor& indices, int64_t m);

}  // namespace convnn::ops::cuda::triton
