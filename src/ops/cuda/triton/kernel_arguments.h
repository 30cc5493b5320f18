#pragma once
// One launch of a Triton kernel as the C++ launchers (*_launches.cpp) describe it: the kernel's key
// (specialisations.py names it), its grid, and its arguments in launch order. A LaunchRunner makes
// it: the embedded images through the CUDA runtime (launch.h), the Python package's launcher
// through the dispatcher (routes.h), or a test's recorder. Plain ATen, no CUDA types.
#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace convnn::ops::cuda::triton {

/// How the kernels address the rows of a [G,rows,width] or [B,H,rows,width] tensor whose rows are
/// unit-stride (python/convnn/_triton/row_chunks.py, slice_starts): slice g = b*H + h starts at
/// element b*batch + h*head (head unused for [G,rows,width], where b = g), its row r at + r*row.
/// The stride of a dimension of size 1 is taken as 0 (it is never stepped over).
struct RowLayout {
  int64_t batch = 0, head = 0, row = 0;
};
RowLayout row_layout(const at::Tensor& t);
/// The slices' heads: H of [B,H,rows,width], 1 of [G,rows,width].
int64_t heads_of(const at::Tensor& t);
/// The slices: G of [G,rows,width], B*H of [B,H,rows,width].
int64_t slices_of(const at::Tensor& t);
/// Whether a kernel can take t's row layout: every stride within a 32-bit kernel argument.
bool row_layout_fits(const at::Tensor& t);

/// A kernel's arguments in launch order, each with its kind (the letters of
/// CompiledKernel::parameters), so that a launch can check them against what the compiled kernel
/// declares before the GPU sees them. Triton's two scratch pointers are added by the launch.
class KernelArguments {
 public:
  KernelArguments& pointer(const at::Tensor& tensor);  // its data; an undefined tensor is null
  KernelArguments& int32(int64_t value);                // checked to fit in 32 bits
  KernelArguments& float32(float value);
  /// A tensor's row layout: its batch, head and row strides, three 32-bit arguments.
  KernelArguments& rows(const RowLayout& layout);
  /// The kinds so far, with the trailing scratch pointers ("...pp").
  std::string kinds() const;
  /// The kinds of the arguments alone (no scratch pointers).
  const std::string& argument_kinds() const { return kinds_; }
  /// The element type of each pointer argument's tensor, one pointee_letter each ('-': null).
  std::string pointees() const;
  /// Pointers to each argument's value, the scratch pointers included (the global one
  /// `global_scratch`, the profile one null): cudaLaunchKernel's `args`.
  void** values(const void* global_scratch = nullptr);
  /// The pointer passed as argument `index` (which must be a pointer argument).
  const void* pointer_at(std::size_t index) const;
  /// The tensor passed as argument `index` (a pointer argument), for a launcher that takes tensors.
  const at::Tensor& tensor_at(std::size_t index) const;
  int32_t int32_at(std::size_t index) const;
  float float32_at(std::size_t index) const;

 private:
  static constexpr int kMaxArguments = 40;  // the fused attention kernel takes 35
  union Slot {
    const void* pointer;
    int32_t int32;
    float float32;
  };
  KernelArguments& add(char kind, Slot slot);
  std::array<Slot, kMaxArguments + 2> slots_{};
  std::array<void*, kMaxArguments + 2> addresses_{};
  std::array<at::Tensor, kMaxArguments> tensors_{};  // the pointer arguments' tensors
  std::string kinds_;
};

/// The letter of a tensor element type in CompiledKernel::pointees (scripts/triton_aot.py's
/// POINTEE_LETTERS): f float32, h float16, b bfloat16, l int64, i int32, ? bool; '!' for a type no
/// kernel reads.
char pointee_letter(at::ScalarType type);

/// Whether pointer arguments of the element types `passed` (KernelArguments::pointees) fit a kernel
/// compiled for `declared` (CompiledKernel::pointees): as many, each of the declared type or null ('*'
/// declared: an output in the op's dtype, any of f, h and b).
bool pointees_fit(const std::string& declared, const std::string& passed);

struct Grid {
  int64_t x = 1, y = 1, z = 1;
};

/// Whether every listed grid fits CUDA's limits (x < 2^31, y and z <= 65535).
bool grid_fits(const Grid& grid);

struct Launch {
  std::string key;  // the specialisation's key (python/convnn/_triton/specialisations.py)
  Grid grid;
  KernelArguments arguments;
};
using LaunchRunner = std::function<void(Launch&)>;

}  // namespace convnn::ops::cuda::triton
