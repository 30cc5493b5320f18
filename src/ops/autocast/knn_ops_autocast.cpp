// Autocast kernels of the core ops: under CPU autocast (e.g. `convnn train --amp`) both ops run
// in the autocast dtype, as ATen's convolutions and matmuls do, so that a ConvNN layer accepts the
// bfloat16 activations of the layers before it together with its float32 parameters.
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "convnn/ops/knn_ops.h"

namespace convnn::autocast {
namespace {

constexpr auto kDevice = c10::DeviceType::CPU;

at::Tensor to_autocast_dtype(const at::Tensor& t) {
  return at::autocast::cached_cast(at::autocast::get_autocast_dtype(kDevice), t, kDevice);
}

c10::optional<at::Tensor> to_autocast_dtype(const c10::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? c10::optional<at::Tensor>(to_autocast_dtype(*t)) : t;
}

std::tuple<at::Tensor, at::Tensor> knn_select(const at::Tensor& queries, const at::Tensor& keys, int64_t k,
                                              c10::string_view similarity, const c10::optional<at::Tensor>& mask,
                                              bool index_order) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  // An additive mask keeps its dtype: the op converts it to its accumulation type.
  return ops::knn_select(to_autocast_dtype(queries), to_autocast_dtype(keys), k, std::string(similarity), mask,
                         index_order);
}

at::Tensor knn_aggregate(const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
                         const at::Tensor& kernel, const c10::optional<at::Tensor>& bias) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  return ops::knn_aggregate(to_autocast_dtype(values), to_autocast_dtype(weights), indices,
                            to_autocast_dtype(kernel), to_autocast_dtype(bias));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention(
    const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
    const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k,
    c10::string_view similarity, const c10::optional<at::Tensor>& mask, bool index_order,
    c10::string_view rho, double temperature) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  return ops::knn_attention(to_autocast_dtype(queries), to_autocast_dtype(keys),
                            to_autocast_dtype(values), to_autocast_dtype(kernel),
                            to_autocast_dtype(bias), k, std::string(similarity), mask, index_order,
                            std::string(rho), temperature);
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, AutocastCPU, m) {
  m.impl("knn_select", &knn_select);
  m.impl("knn_aggregate", &knn_aggregate);
  m.impl("knn_attention", &knn_attention);
}

}  // namespace convnn::autocast
