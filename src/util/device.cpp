#include "convnn/util/device.h"

#include <ATen/DeviceAccelerator.h>
#include <c10/util/Exception.h>

#include <string>

namespace convnn {
namespace {

c10::Device parse_device(std::string_view text, std::string_view argument) {
  try {
    return c10::Device(std::string(text));
  } catch (const c10::Error&) {
    TORCH_CHECK(false, argument, " must name a device (cpu, cuda, cuda:N, mps, xpu, ..., or auto); got '",
                text, "'");
  }
}

}  // namespace

c10::Device resolve_device(std::string_view text, std::string_view argument) {
  if (text == "auto") {
    const auto accelerator = at::accelerator::getAccelerator(/*checked=*/false);
    if (accelerator && at::accelerator::deviceCount() > 0) {
      return c10::Device(*accelerator, at::accelerator::getDeviceIndex());
    }
    return c10::Device(c10::kCPU);
  }
  c10::Device device = parse_device(text, argument);
  if (device.is_cpu()) return device;
  const auto accelerator = at::accelerator::getAccelerator(/*checked=*/false);
  const bool present = accelerator && *accelerator == device.type() && at::accelerator::deviceCount() > 0;
  TORCH_CHECK(present, argument, " ", text, ": no ", c10::DeviceTypeName(device.type(), /*lower_case=*/true),
              " device is available to this process (this torch build ",
              accelerator ? "has " + c10::DeviceTypeName(*accelerator, true) + " support"
                          : std::string("supports no accelerator"),
              "); use --device cpu");
  if (!device.has_index()) return c10::Device(device.type(), at::accelerator::getDeviceIndex());
  TORCH_CHECK(device.index() < at::accelerator::deviceCount(), argument, " ", text, ": there are only ",
              static_cast<int>(at::accelerator::deviceCount()), " ",
              c10::DeviceTypeName(device.type(), true), " devices (indices from 0)");
  return device;
}

std::string device_name(const c10::Device& device) { return device.str(); }

}  // namespace convnn
