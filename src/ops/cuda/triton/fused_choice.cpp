#include "ops/cuda/triton/fused_choice.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "ops/cuda/triton/first_call_check.h"

namespace convnn::ops::cuda::triton {

bool fused_kernels_chosen() {
  static const bool chosen = [] {
    const char* choice = std::getenv("CONVNN_CUDA_KERNELS");
    const std::string value = choice == nullptr ? "fused" : choice;
    TORCH_CHECK(value == "fused" || value == "generic",
                "CONVNN_CUDA_KERNELS must be 'fused' or 'generic', got '", value, "'");
    return value == "fused";
  }();
  return chosen;
}

bool device_verified(const at::Tensor& t) {
  static std::mutex mutex;
  static std::map<std::pair<int, at::ScalarType>, bool> verified;
  const std::pair<int, at::ScalarType> key{t.get_device(), t.scalar_type()};
  std::lock_guard<std::mutex> lock(mutex);
  const auto found = verified.find(key);
  if (found != verified.end()) return found->second;
  std::optional<std::string> failure;
  try {
    failure = first_call_check(t.device(), t.scalar_type());
  } catch (const std::exception& error) {  // an image that does not load or launch on this GPU
    failure = std::string("(") + error.what() + ")";
  }
  if (failure) {
    TORCH_WARN("convnn: the fused Triton kernel ", *failure, " disagrees with the generic path on ", t.device(),
               " (", t.scalar_type(), "); convnn uses the generic path there from now on");
  }
  verified.emplace(key, !failure);
  return !failure;
}

bool fused_dtype(at::ScalarType dtype) { return dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf; }

bool on_one_device(const at::Tensor& first, std::initializer_list<at::Tensor> others) {
  for (const auto& t : others) {
    if (t.defined() && t.device() != first.device()) return false;
  }
  return true;
}

}  // namespace convnn::ops::cuda::triton
