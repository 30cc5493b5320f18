#pragma once
// When the embedded Triton kernels run instead of the device-generic path: the
// CONVNN_CUDA_KERNELS switch and the first-call check per device and dtype, shared by every op
// they serve (knn_aggregate_triton.cpp, knn_select_triton.cpp).
#include <ATen/core/Tensor.h>

#include <initializer_list>

namespace convnn::ops::cuda::triton {

/// CONVNN_CUDA_KERNELS: "fused" (the default) or "generic" (the kernels stay off), read once.
bool fused_kernels_chosen();

/// Whether the kernels passed their first-call check (first_call_check.h) on `t`'s device and
/// dtype: run on the first call per (device, dtype), then remembered; a failure warns once, naming
/// the kernel, and the generic path serves that device and dtype from then on.
bool device_verified(const at::Tensor& t);

/// Whether the kernels were compiled for `dtype`: float32, bfloat16 or float16 (float64 takes the
/// generic path).
bool fused_dtype(at::ScalarType dtype);

/// Whether every defined tensor of `others` is on `first`'s device.
bool on_one_device(const at::Tensor& first, std::initializer_list<at::Tensor> others);

}  // namespace convnn::ops::cuda::triton
