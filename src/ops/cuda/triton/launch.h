#pragma once
// Launching the embedded Triton kernels (compiled_kernels.h) through the CUDA runtime's library API
// (cudaLibraryLoadData, cudaLibraryGetKernel, cudaLaunchKernel): libcudart only, no libcuda at link
// time, so the library loads on a machine without a driver. Every failure is a TORCH_CHECK
// naming the kernel and the CUDA error; nothing prints or exits. In libconvnn_triton_kernels only
// (CONVNN_TRITON_AOT), which registers itself as the embedded route when loaded (routes.h).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ops/cuda/triton/compiled_kernels.h"
#include "ops/cuda/triton/kernel_arguments.h"

namespace convnn::ops::cuda::triton {

/// The compiled kernel for `key` on GPU `device` (find_compiled_kernel's choice for its compute
/// capability), or nullptr when none fits; looked up once per (key, device), as every launch asks.
const CompiledKernel* kernel_for_device(const std::string& key, int device);

/// Whether GPU `device` has an image of every one of `keys`; computed once per (device, `set`),
/// where `set` names the list (the ops ask on every call).
bool device_has_kernels(int device, const std::string& set, const std::vector<std::string>& keys);

/// Launches `key` on the current device and stream. An empty grid launches nothing.
void launch(const char* key, const Grid& grid, KernelArguments& arguments);

/// The CUDA launch of `launch` on the current device and stream: the embedded route's runner.
void run_on_gpu(Launch& launch);

}  // namespace convnn::ops::cuda::triton
