#pragma once
// Launching the embedded Triton kernels (compiled_kernels.h) through the CUDA runtime's library API
// (cudaLibraryLoadData, cudaLibraryGetKernel, cudaLaunchKernel): libcudart only, no libcuda at link
// time, so libconvnn_ops still loads on a machine without a driver. Every failure is a TORCH_CHECK
// naming the kernel and the CUDA error; nothing prints or exits.
#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/cuda/triton/compiled_kernels.h"

namespace convnn::ops::cuda::triton {

/// A kernel's arguments in launch order, each with its kind (the letters of
/// CompiledKernel::parameters), so that a launch can check them against what the compiled kernel
/// declares before the GPU sees them. Triton's two scratch pointers are added by the launch.
class KernelArguments {
 public:
  KernelArguments& pointer(const at::Tensor& tensor);  // its data; an undefined tensor is null
  KernelArguments& int32(int64_t value);                // checked to fit in 32 bits
  KernelArguments& float32(float value);
  /// The kinds so far, with the trailing scratch pointers ("...pp").
  std::string kinds() const;
  /// Pointers to each argument's value, the scratch pointers included: cudaLaunchKernel's `args`.
  void** values();
  /// The pointer passed as argument `index` (which must be a pointer argument).
  const void* pointer_at(std::size_t index) const;

 private:
  static constexpr int kMaxArguments = 24;  // the fused attention kernel takes 22
  union Slot {
    const void* pointer;
    int32_t int32;
    float float32;
  };
  KernelArguments& add(char kind, Slot slot);
  std::array<Slot, kMaxArguments + 2> slots_{};
  std::array<void*, kMaxArguments + 2> addresses_{};
  std::string kinds_;
};

struct Grid {
  int64_t x = 1, y = 1, z = 1;
};

/// Whether every listed grid fits CUDA's limits (x < 2^31, y and z <= 65535).
bool grid_fits(const Grid& grid);

/// The compiled kernel for `key` on GPU `device` (find_compiled_kernel's choice for its compute
/// capability), or nullptr when none fits; looked up once per (key, device), as every launch asks.
const CompiledKernel* kernel_for_device(const std::string& key, int device);

/// Whether GPU `device` has an image of every one of `keys`; computed once per (device, `set`),
/// where `set` names the list (the ops ask on every call).
bool device_has_kernels(int device, const std::string& set, const std::vector<std::string>& keys);

/// Launches `key` on the current device and stream. An empty grid launches nothing.
void launch(const char* key, const Grid& grid, KernelArguments& arguments);

}  // namespace convnn::ops::cuda::triton
