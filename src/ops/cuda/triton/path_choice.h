#pragma once
// One place that chooses, for each call of a core op on a CUDA tensor, between the Triton kernels
// and the path that composes ATen (the device-generic kernel, or knn_attention's composition of the
// core ops), and says why, as NATTEN names its backend choice: the CONVNN_CUDA_KERNELS switch, the
// inputs the kernels take, the route to them (routes.h) and the first-call check per device, dtype
// and route. convnn::cuda_path_log keeps the choices while asked (Python: convnn.cuda_paths()).
#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "ops/cuda/triton/kernel_arguments.h"

namespace convnn::ops::cuda::triton {

/// A call's path: `run` launches the Triton kernels (empty: the ATen path), `why` says why.
struct PathChoice {
  LaunchRunner run;
  std::string why;
  bool fused() const { return static_cast<bool>(run); }
};

/// The rules every op shares, in order; the first that fails is the answer. An op adds its own
/// input rules with `require` before `choose`.
class PathRules {
 public:
  /// CONVNN_CUDA_KERNELS (read on each call: "fused", the default, or "generic"), the dtype (the
  /// kernels take float32, bfloat16, float16) and one device for every defined tensor.
  PathRules(const at::Tensor& first, std::initializer_list<at::Tensor> others);
  /// An op's own rule: when `holds` is false, the ATen path, because `why_not`.
  PathRules& require(bool holds, const char* why_not);
  /// Whether every rule so far holds (the kernels' keys may depend on it).
  bool holds() const { return why_not_.empty(); }
  /// The route to kernels `keys` (`set` names the list) and the first-call check on `first`'s
  /// device and dtype over that route; the choice, recorded where convnn::cuda_path_log asks.
  PathChoice choose(const char* op, const std::string& set, const std::vector<std::string>& keys);
  /// choose() among kernels compiled per dtype: the keys that `keys_of` gives for `first`'s dtype
  /// (float32's where a rule already failed, since that dtype may be one the kernels do not take),
  /// the set named `set` and the dtype.
  PathChoice choose_per_dtype(const char* op, const std::string& set,
                              const std::vector<std::string>& (*keys_of)(at::ScalarType));

 private:
  at::Tensor first_;
  std::string why_not_;
};

/// CONVNN_DEVICE_VALUE_CHECKS=1, the debug switch under which an accelerator's ops read values
/// back (src/ops/checks.cpp): only the ATen path raises on an unrankable score.
bool device_value_checks();

}  // namespace convnn::ops::cuda::triton
