#pragma once
// What the Autocast kernels of the core ops (src/ops/autocast/knn_*.cpp, one file per op) share.
// They serve the CPU's, CUDA's, XPU's and MPS's autocast: under autocast (e.g. `convnn train
// --amp`, or torch.autocast("cuda")) the ops run in the autocast dtype (bfloat16 or float16), as
// ATen's convolutions and matmuls do, so that a ConvNN layer accepts the low-precision activations
// of the layers before it together with its float32 parameters. One template per device type.
//
// Every device with an autocast of its own whose ops the generic path serves is registered whether
// or not this build has kernels for it: under autocast the generic path runs in the autocast dtype,
// as a fused kernel would. The keys are the ones ATen maps these device types to (autocast_key).
#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/DispatchKey.h>

namespace convnn::autocast {

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

}  // namespace convnn::autocast
