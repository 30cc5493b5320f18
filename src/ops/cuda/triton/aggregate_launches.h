#pragma once
// The host side of the knn_aggregate Triton kernels: the launches that python/convnn/_triton/
// aggregate.py makes, made from C++ with the same grids and arguments. Each launch goes through a
// LaunchRunner, the CUDA launch in production; tests pass one that records the launches, so every
// line here runs and is checked against the compiled kernels' parameter lists on a machine with
// no GPU (tests/ops/triton_aot_test.cpp).
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <array>
#include <functional>
#include <string>
#include <tuple>
#include <utility>

#include "ops/cuda/triton/launch.h"

namespace convnn::ops::cuda::triton {

struct Launch {
  std::string key;  // the CompiledKernel key
  Grid grid;
  KernelArguments arguments;
};
using LaunchRunner = std::function<void(Launch&)>;

/// The CUDA launch of `launch` on the current device and stream.
void run_on_gpu(Launch& launch);

/// Whether the table has the aggregation kernels for `dtype` (float32, bfloat16, float16).
bool has_aggregate_kernels(at::ScalarType dtype);
/// Whether the kernels take these (checked) inputs: a dtype they were compiled for, every size and
/// every grid within what their 32-bit arguments and CUDA's grid limits allow.
bool aggregate_fits(const at::Tensor& values, const at::Tensor& weights, const at::Tensor& kernel);
/// Whether the GPU `device` (an index) has an image of every aggregation kernel for `dtype`.
bool device_has_aggregate_kernels(int device, at::ScalarType dtype);

// As convnn::knn_aggregate and knn_aggregate_backward, for inputs that the caller checked and made
// contiguous (kernel [C,K] or [C',C,K], bias undefined or [C']), every size within 32 bits.
at::Tensor aggregate_forward(const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
                             const at::Tensor& kernel, const at::Tensor& bias,
                             const LaunchRunner& run = run_on_gpu);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> aggregate_backward(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
    const at::Tensor& kernel, std::array<bool, 4> output_mask, const LaunchRunner& run = run_on_gpu);

/// (order, run_start): the G*N*K slots sorted stably by the values row they read (g*M + index),
/// and where each of the G*M rows' runs starts (G*M + 1 entries). No host synchronisation.
std::pair<at::Tensor, at::Tensor> inverse_index(const at::Tensor& indices, int64_t m);

}  // namespace convnn::ops::cuda::triton
