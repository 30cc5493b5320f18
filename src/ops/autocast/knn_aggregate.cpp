// knn_aggregate under the autocast keys of the CPU, CUDA, XPU and MPS: it runs in the autocast dtype
// (src/ops/autocast/autocast_cast.h).
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "convnn/ops/knn_ops.h"
#include "ops/autocast/autocast_cast.h"
#include "ops/op_signatures.h"

namespace convnn::autocast {
namespace {

template <c10::DeviceType kDevice>
at::Tensor knn_aggregate(const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
                         const at::Tensor& kernel, const c10::optional<at::Tensor>& bias) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key<kDevice>());
  return ops::knn_aggregate(to_autocast_dtype<kDevice>(values), to_autocast_dtype<kDevice>(weights), indices,
                            to_autocast_dtype<kDevice>(kernel), to_autocast_dtype<kDevice>(bias));
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, AutocastCPU, m) {
  ops::op::implement<ops::op::KnnAggregate>(m, &knn_aggregate<c10::DeviceType::CPU>);
}
TORCH_LIBRARY_IMPL(convnn, AutocastCUDA, m) {
  ops::op::implement<ops::op::KnnAggregate>(m, &knn_aggregate<c10::DeviceType::CUDA>);
}
TORCH_LIBRARY_IMPL(convnn, AutocastXPU, m) {
  ops::op::implement<ops::op::KnnAggregate>(m, &knn_aggregate<c10::DeviceType::XPU>);
}
TORCH_LIBRARY_IMPL(convnn, AutocastMPS, m) {
  ops::op::implement<ops::op::KnnAggregate>(m, &knn_aggregate<c10::DeviceType::MPS>);
}

}  // namespace convnn::autocast
