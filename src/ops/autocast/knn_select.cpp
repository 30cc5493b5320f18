// knn_select under the autocast keys of the CPU, CUDA, XPU and MPS: it runs in the autocast dtype
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
std::tuple<at::Tensor, at::Tensor> knn_select(const at::Tensor& queries, const at::Tensor& keys, int64_t k,
                                              c10::string_view similarity, const c10::optional<at::Tensor>& mask,
                                              bool index_order) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key<kDevice>());
  // An additive mask keeps its dtype: the op converts it to its accumulation type.
  return ops::knn_select(to_autocast_dtype<kDevice>(queries), to_autocast_dtype<kDevice>(keys), k, std::string(similarity), mask,
                         index_order);
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, AutocastCPU, m) {
  ops::op::implement<ops::op::KnnSelect>(m, &knn_select<c10::DeviceType::CPU>);
}
TORCH_LIBRARY_IMPL(convnn, AutocastCUDA, m) {
  ops::op::implement<ops::op::KnnSelect>(m, &knn_select<c10::DeviceType::CUDA>);
}
TORCH_LIBRARY_IMPL(convnn, AutocastXPU, m) {
  ops::op::implement<ops::op::KnnSelect>(m, &knn_select<c10::DeviceType::XPU>);
}
TORCH_LIBRARY_IMPL(convnn, AutocastMPS, m) {
  ops::op::implement<ops::op::KnnSelect>(m, &knn_select<c10::DeviceType::MPS>);
}

}  // namespace convnn::autocast
