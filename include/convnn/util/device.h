#pragma once
// The device a command or a trainer runs on, from a user's text ("cpu", "cuda", "cuda:1", "mps",
// "auto"). One rule for every entry point: `convnn train/eval/compare/bench --device` and the
// Python package.
#include <c10/core/Device.h>

#include <string_view>

namespace convnn {

/// "auto" picks the machine's accelerator (CUDA, MPS, XPU, ...) when this torch build has one and a
/// device is present, else the CPU. Any other text is parsed as torch does ("cuda", "cuda:1"); an
/// accelerator without an index means its current device. Throws c10::Error naming `argument`,
/// the text and the rule when the text is not a device, or the device is not present.
c10::Device resolve_device(std::string_view text, std::string_view argument = "--device");

/// "cpu", "cuda:0", ... : the text resolve_device reads back.
std::string device_name(const c10::Device& device);

}  // namespace convnn
