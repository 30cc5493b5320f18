#pragma once
// The two ways a call's Triton kernels are launched, both driven by the same C++ launchers
// (*_launches.cpp: one key, grid and argument list per launch; issue 38 §4):
// - embedded: the images compiled ahead of time (CONVNN_TRITON_AOT) into libconvnn_triton_kernels,
//   which this library loads from beside itself on the first call on a CUDA tensor, launched through
//   the CUDA runtime (launch.h), for CUDA tensors on a GPU that has an image of each key;
// - python: the Python package's launcher, the CUDA kernel of convnn::_triton_launch that
//   python/convnn/_triton/register.py registers: Triton compiles each key's kernel
//   (specialisations.py) for the GPU it runs on. A library without the embedded images (the
//   Python package's) takes this one; under Triton's interpreter it runs on CPU tensors too, which
//   is how the tests prove the launchers and kernels together without a GPU.
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "ops/cuda/triton/kernel_arguments.h"

namespace convnn::ops::cuda::triton {

/// What libconvnn_triton_kernels provides (launch.cpp registers it when loaded).
struct EmbeddedKernels {
  bool (*device_has)(int device, const std::string& set, const std::vector<std::string>& keys);
  void (*run)(Launch& launch);
};
void register_embedded_kernels(EmbeddedKernels kernels);

/// Loads libconvnn_triton_kernels (built on request, linked by nothing: src/CMakeLists.txt) once
/// from the folder of libconvnn_ops, where the build and the install put it; its static initialiser
/// registers the kernels. route_for calls it on the first call on a CUDA tensor. Returns "" when it
/// is loaded (or the build has no such library), else why not.
std::string load_embedded_kernels();

struct Route {
  std::string name;  // "embedded" or "python"
  LaunchRunner run;
};

/// The route for a call on `t`'s device whose launches may ask for any of `keys` (`set` names that
/// list, for the embedded route's per-device answer): the embedded images where they cover the
/// device, else the Python launcher where one is registered; nothing (and why in `why_not`) where
/// neither is there.
std::optional<Route> route_for(const at::Tensor& t, const std::string& set, const std::vector<std::string>& keys,
                               std::string& why_not);

/// A launch through convnn::_triton_launch's CUDA kernel (whatever the tensors' device).
void run_through_python(Launch& launch);

}  // namespace convnn::ops::cuda::triton
