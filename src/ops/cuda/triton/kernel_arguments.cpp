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

KernelArguments& KernelArguments::rows(const RowLayout& layout) {
  return int32(layout.batch).int32(layout.head).int32(layout.row);
}

std::string KernelArguments::kinds() const { return kinds_ + "pp"; }

std::string KernelArguments::pointees() const {
  std::string letters;
  for (std::size_t i = 0; i < kinds_.size(); ++i) {
    if (kinds_[i] == 'p') letters += tensors_[i].defined() ? pointee_letter(tensors_[i].scalar_type()) : '-';
  }
  return letters;
}

char pointee_letter(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return 'f';
    case at::kHalf: return 'h';
    case at::kBFloat16: return 'b';
    case at::kLong: return 'l';
    case at::kInt: return 'i';
    case at::kBool: return '?';
    default: return '!';
  }
}

bool pointees_fit(const std::string& declared, const std::string& passed) {
  if (declared.size() != passed.size()) return false;
  for (std::size_t i = 0; i < declared.size(); ++i) {
    // '*': an output in the op's dtype (a floating type), which the kernel's dtype_code names.
    const bool floating = passed[i] == 'f' || passed[i] == 'h' || passed[i] == 'b';
    if (passed[i] != '-' && passed[i] != declared[i] && !(declared[i] == '*' && floating)) return false;
  }
  return true;
}

void** KernelArguments::values(const void* global_scratch) {
  // Triton 3.6 appends a global and a profile scratch pointer to every kernel's parameters: the
  // global one is the memory of kernels that make TMA descriptors on the device (the launch allocates
  // it), no kernel here profiles (scripts/triton_aot.py refuses one that does).
  const std::size_t count = kinds_.size();
  slots_[count].pointer = global_scratch;
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

RowLayout row_layout(const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(t.dim() == 3 || t.dim() == 4, "row_layout: a [G,rows,width] or [B,H,rows,width] tensor, got ",
                        t.sizes());
  const auto stride = [&](int64_t dim) { return t.size(dim) == 1 ? int64_t{0} : t.stride(dim); };
  if (t.dim() == 3) return {stride(0), 0, stride(1)};
  return {stride(0), stride(1), stride(2)};
}

int64_t heads_of(const at::Tensor& t) { return t.dim() == 4 ? t.size(1) : 1; }

int64_t slices_of(const at::Tensor& t) { return t.dim() == 4 ? t.size(0) * t.size(1) : t.size(0); }

bool row_layout_fits(const at::Tensor& t) {
  const auto layout = row_layout(t);
  constexpr int64_t kInt32 = std::numeric_limits<int32_t>::max();
  return layout.batch <= kInt32 && layout.head <= kInt32 && layout.row <= kInt32 && layout.batch >= 0 &&
         layout.head >= 0 && layout.row >= 0;
}

bool grid_fits(const Grid& grid) {
  return grid.x >= 0 && grid.y >= 0 && grid.z >= 0 && grid.x <= std::numeric_limits<int32_t>::max() &&
         grid.y <= 65535 && grid.z <= 65535;
}

}  // namespace convnn::ops::cuda::triton
