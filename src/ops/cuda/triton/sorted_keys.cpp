#include "ops/cuda/triton/sorted_keys.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#if CONVNN_TORCH_CUDA
#include <ATen/cuda/cub.h>
#include <c10/core/DeviceGuard.h>
#endif

#include <limits>

namespace convnn::ops::cuda::triton {

int64_t bits_for(int64_t largest) {
  TORCH_INTERNAL_ASSERT(largest >= 0, "bits_for: ", largest);
  int64_t bits = 1;
  while (bits < 63 && (largest >> bits) != 0) ++bits;
  return bits;
}

SortedKeys sorted_keys(const at::Tensor& keys, int64_t key_bits, bool descending) {
  // A launcher's precondition, not a user's input.
  TORCH_INTERNAL_ASSERT(keys.scalar_type() == at::kInt && keys.dim() == 1 && keys.is_contiguous(),
                        "sorted_keys: contiguous 1-D int32 keys");
  TORCH_INTERNAL_ASSERT(key_bits >= 1 && key_bits <= 31 && keys.numel() <= std::numeric_limits<int32_t>::max(),
                        "sorted_keys: ", key_bits, " key bits, ", keys.numel(), " keys");
  if (keys.numel() == 0) return {keys.clone(), keys.clone()};
#if CONVNN_TORCH_CUDA
  if (keys.is_cuda()) {
    const c10::OptionalDeviceGuard device(keys.device());
    auto sorted = at::empty_like(keys);
    auto positions = at::empty_like(keys);
    const auto from = at::arange(keys.numel(), keys.options());
    at::cuda::cub::radix_sort_pairs<int32_t, int32_t>(
        keys.const_data_ptr<int32_t>(), sorted.mutable_data_ptr<int32_t>(), from.const_data_ptr<int32_t>(),
        positions.mutable_data_ptr<int32_t>(), keys.numel(), descending, /*begin_bit=*/0, key_bits);
    return {sorted, positions};
  }
#endif
  const auto [sorted, positions] = keys.sort(/*stable=*/true, /*dim=*/0, descending);
  return {sorted, positions.to(at::kInt)};
}

}  // namespace convnn::ops::cuda::triton
