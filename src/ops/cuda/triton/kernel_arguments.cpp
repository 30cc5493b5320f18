#include "ops/cuda/triton/kernel_arguments.h"

#include <c10/util/Exception.h>

#include <limits>

namespace convnn::ops::cuda::triton {

KernelArguments& KernelArguments::add(char kind, Slot slot) {
  // More arguments than any kernel takes is a bug in a launcher, not a user's input.
  TORCH_INTERNAL_ASSERT(kinds_.size() < kMaxArguments, "KernelArguments: more than ", kMaxArguments,
                        " arguments");
  slots_[kinds_.size()] = slot;
  kinds_.push_back(kind);
  return *this;
}

KernelArguments& KernelArguments::pointer(const at::Tensor& tensor) {
  Slot slot;
  slot.pointer = tensor.defined() ? tensor.const_data_ptr() : nullptr;
  tensors_[kinds_.size()] = tensor;
  return add('p', slot);
}

KernelArguments& KernelArguments::int32(int64_t value) {
  TORCH_INTERNAL_ASSERT(value >= std::numeric_limits<int32_t>::min() && value <= std::numeric_limits<int32_t>::max(),
                        "KernelArguments: ", value, " does not fit a 32-bit kernel argument");
  Slot slot;
  slot.int32 = static_cast<int32_t>(value);
  return add('i', slot);
}

KernelArguments& KernelArguments::float32(float value) {
  Slot slot;
  slot.float32 = value;
  return add('f', slot);
}

std::string KernelArguments::kinds() const { return kinds_ + "pp"; }

void** KernelArguments::values() {
  // Triton 3.6 appends a global and a profile scratch pointer to every kernel's parameters; the
  // kernels here use neither (scripts/triton_aot.py refuses one that does), so both are null.
  const std::size_t count = kinds_.size();
  slots_[count].pointer = nullptr;
  slots_[count + 1].pointer = nullptr;
  for (std::size_t i = 0; i < count + 2; ++i) addresses_[i] = &slots_[i];
  return addresses_.data();
}

namespace {

void check_kind(const std::string& kinds, std::size_t index, char kind) {
  TORCH_INTERNAL_ASSERT(index < kinds.size() && kinds[index] == kind, "KernelArguments: argument ", index,
                        " is not of kind '", kind, "'");
}

}  // namespace

const void* KernelArguments::pointer_at(std::size_t index) const {
  check_kind(kinds_, index, 'p');
  return slots_[index].pointer;
}

const at::Tensor& KernelArguments::tensor_at(std::size_t index) const {
  check_kind(kinds_, index, 'p');
  return tensors_[index];
}

int32_t KernelArguments::int32_at(std::size_t index) const {
  check_kind(kinds_, index, 'i');
  return slots_[index].int32;
}

float KernelArguments::float32_at(std::size_t index) const {
  check_kind(kinds_, index, 'f');
  return slots_[index].float32;
}

bool grid_fits(const Grid& grid) {
  return grid.x >= 0 && grid.y >= 0 && grid.z >= 0 && grid.x <= std::numeric_limits<int32_t>::max() &&
         grid.y <= 65535 && grid.z <= 65535;
}

}  // namespace convnn::ops::cuda::triton
