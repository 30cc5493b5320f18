#include "support/registered_devices.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace convnn::testing {

void PrintTo(const BackendKey& backend, std::ostream* os) { *os << backend.key; }

const std::vector<std::string>& core_op_names() {
  static const std::vector<std::string> names{"knn_select",    "knn_select_backward",
                                              "knn_aggregate", "knn_aggregate_backward",
                                              "knn_attention", "knn_attention_backward"};
  return names;
}

const std::vector<BackendKey>& backend_keys() {
  using c10::DeviceType;
  using c10::DispatchKey;
  static const std::vector<BackendKey> keys{
      {DispatchKey::CPU, DeviceType::CPU},   {DispatchKey::CUDA, DeviceType::CUDA},
      {DispatchKey::HIP, DeviceType::HIP},   {DispatchKey::XPU, DeviceType::XPU},
      {DispatchKey::MPS, DeviceType::MPS},   {DispatchKey::MTIA, DeviceType::MTIA},
      {DispatchKey::HPU, DeviceType::HPU},   {DispatchKey::PrivateUse1, DeviceType::PrivateUse1}};
  return keys;
}

std::vector<std::string> ops_registered_for(c10::DispatchKey key) {
  std::vector<std::string> registered;
  for (const auto& name : core_op_names()) {
    const auto op = c10::Dispatcher::singleton().findOp({"convnn::" + name, ""});
    // hasKernelForDispatchKey looks at the key's own table entry: an alias key's kernel
    // (CompositeExplicitAutograd) that the key merely inherits is not found, which is the point.
    if (op.has_value() && op->hasKernelForDispatchKey(key)) registered.push_back(name);
  }
  return registered;
}

std::vector<BackendKey> registered_backend_keys() {
  std::vector<BackendKey> registered;
  for (const auto& backend : backend_keys()) {
    if (!ops_registered_for(backend.key).empty()) registered.push_back(backend);
  }
  return registered;
}

bool device_present(c10::DeviceType device) {
  if (device == c10::DeviceType::CPU) return true;
  // A device type's guard is registered when its runtime (libtorch_cuda, ...) is loaded; its count
  // is 0 on a machine without the device, where it neither throws nor initialises anything.
  return c10::impl::hasDeviceGuardImpl(device) && c10::impl::getDeviceGuardImpl(device)->deviceCount() > 0;
}

}  // namespace convnn::testing
