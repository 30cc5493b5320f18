// Autocast kernels of the core ops, for the CPU's, CUDA's, XPU's and MPS's autocast: under autocast (e.g. `convnn train
// --amp`, or torch.autocast("cuda")) the ops run in the autocast dtype (bfloat16 or float16), as
// ATen's convolutions and matmuls do, so that a ConvNN layer accepts the low-precision activations
// of the layers before it together with its float32 parameters. One template per device type.
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "convnn/ops/knn_ops.h"

namespace convnn::autocast {
namespace {

template <c10::DeviceType kDevice>
at::Tensor to_autocast_dtype(const at::Tensor& t) {
  return at::autocast::cached_cast(at::autocast::get_autocast_dtype(kDevice), t, kDevice);
}

template <c10::DeviceType kDevice>
c10::optional<at::Tensor> to_autocast_dtype(const c10::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? c10::optional<at::Tensor>(to_autocast_dtype<kDevice>(*t)) : t;
}

// The device's autocast key, from ATen's own mapping.
template <c10::DeviceType kDevice>
c10::DispatchKey autocast_key() {
  return at::autocast::get_autocast_dispatch_key_from_device_type(kDevice);
}

template <c10::DeviceType kDevice>
std::tuple<at::Tensor, at::Tensor> knn_select(const at::Tensor& queries, const at::Tensor& keys, int64_t k,
                                              c10::string_view similarity, const c10::optional<at::Tensor>& mask,
                                              bool index_order) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key<kDevice>());
  // An additive mask keeps its dtype: the op converts it to its accumulation type.
  return ops::knn_select(to_autocast_dtype<kDevice>(queries), to_autocast_dtype<kDevice>(keys), k, std::string(similarity), mask,
                         index_order);
}

template <c10::DeviceType kDevice>
at::Tensor knn_aggregate(const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
                         const at::Tensor& kernel, const c10::optional<at::Tensor>& bias) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key<kDevice>());
  return ops::knn_aggregate(to_autocast_dtype<kDevice>(values), to_autocast_dtype<kDevice>(weights), indices,
                            to_autocast_dtype<kDevice>(kernel), to_autocast_dtype<kDevice>(bias));
}

template <c10::DeviceType kDevice>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention(
    const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
    const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k,
    c10::string_view similarity, const c10::optional<at::Tensor>& mask, bool index_order,
    c10::string_view rho, double temperature) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key<kDevice>());
  return ops::knn_attention(to_autocast_dtype<kDevice>(queries), to_autocast_dtype<kDevice>(keys),
                            to_autocast_dtype<kDevice>(values), to_autocast_dtype<kDevice>(kernel),
                            to_autocast_dtype<kDevice>(bias), k, std::string(similarity), mask, index_order,
                            std::string(rho), temperature);
}

template <c10::DeviceType kDevice>
void register_autocast(torch::Library& m) {
  m.impl("knn_select", &knn_select<kDevice>);
  m.impl("knn_aggregate", &knn_aggregate<kDevice>);
  m.impl("knn_attention", &knn_attention<kDevice>);
}

}  // namespace

// Every device with an autocast of its own whose ops the generic path serves, registered whether
// or not this build has kernels for it: under autocast the generic path runs in the autocast
// dtype, as a fused kernel would. The keys are the ones ATen maps these device types to.
TORCH_LIBRARY_IMPL(convnn, AutocastCPU, m) { register_autocast<c10::DeviceType::CPU>(m); }
TORCH_LIBRARY_IMPL(convnn, AutocastCUDA, m) { register_autocast<c10::DeviceType::CUDA>(m); }
TORCH_LIBRARY_IMPL(convnn, AutocastXPU, m) { register_autocast<c10::DeviceType::XPU>(m); }
TORCH_LIBRARY_IMPL(convnn, AutocastMPS, m) { register_autocast<c10::DeviceType::MPS>(m); }

}  // namespace convnn::autocast
