#include "ops/cuda/triton/compiled_kernels.h"

#include <cstring>

namespace convnn::ops::cuda::triton {

const CompiledKernel* find_compiled_kernel(const char* key, int major, int minor) {
  const CompiledKernel* cubin = nullptr;
  const CompiledKernel* ptx = nullptr;
  const int device_arch = major * 10 + minor;
  for (std::size_t i = 0; i < kCompiledKernelCount; ++i) {
    const CompiledKernel& entry = kCompiledKernels[i];
    if (std::strcmp(entry.key, key) != 0) continue;
    if (entry.kind == ImageKind::kPtx) {
      ptx = &entry;
      continue;
    }
    // A cubin runs on GPUs of its own major version and a minor at or above its own; Triton's
    // sm_90 cubins are sm_90a, which run on 9.0 only.
    const bool runs = entry.arch / 10 == major && entry.arch <= device_arch &&
                      (entry.arch != 90 || device_arch == 90);
    if (runs && (cubin == nullptr || entry.arch > cubin->arch)) cubin = &entry;
  }
  if (cubin != nullptr) return cubin;
  // PTX is compiled by the driver for any GPU at or above its architecture; it serves the GPUs
  // newer than every cubin (an sm_80 PTX on a 9.x GPU has the sm_90a cubin instead).
  if (ptx != nullptr && device_arch >= ptx->arch) {
    bool newer_than_every_cubin = true;
    for (std::size_t i = 0; i < kCompiledKernelCount; ++i) {
      const CompiledKernel& entry = kCompiledKernels[i];
      if (entry.kind == ImageKind::kCubin && std::strcmp(entry.key, key) == 0 && entry.arch / 10 >= major) {
        newer_than_every_cubin = false;
      }
    }
    if (newer_than_every_cubin) return ptx;
  }
  return nullptr;
}

}  // namespace convnn::ops::cuda::triton
