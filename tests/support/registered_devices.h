#pragma once
// Which backends the convnn ops have kernels for, asked of the dispatcher rather than listed by
// hand, so that the device sweep (tests/ops/registered_devices_test.cpp) covers a device as soon as
// its files under src/ops/<key>/ register a kernel, with no test to edit.
#include <c10/core/DeviceType.h>
#include <c10/core/DispatchKey.h>

#include <ostream>
#include <string>
#include <vector>

namespace convnn::testing {

// A backend dispatch key and the device type of the tensors that reach it.
struct BackendKey {
  c10::DispatchKey key;
  c10::DeviceType device;
};

// gtest shows a BackendKey by its key's name, not by its bytes (which include padding).
void PrintTo(const BackendKey& backend, std::ostream* os);

// The core ops whose kernels a backend may register: the three forward ops and their backwards.
const std::vector<std::string>& core_op_names();

// The backend keys a device's kernels register under (CPU, CUDA, HIP, XPU, MPS, ...), whether or
// not anything is registered for them. Not the Meta key: it has no device to compute on.
const std::vector<BackendKey>& backend_keys();

// The core ops that have a kernel registered for `key` itself (a kernel reached only through
// CompositeExplicitAutograd, the generic path, does not count), in core_op_names()'s order.
std::vector<std::string> ops_registered_for(c10::DispatchKey key);

// The backend keys for which at least one core op has a kernel, in backend_keys()'s order.
std::vector<BackendKey> registered_backend_keys();

// Whether this process can make tensors on a device of this type: the CPU always, another type when
// its runtime is loaded and counts at least one device.
bool device_present(c10::DeviceType device);

}  // namespace convnn::testing
