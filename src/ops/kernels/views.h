#pragma once
// Strided views that kernels of every device take instead of tensors: raw pointers and element
// strides, callable on host and device.
#include <c10/macros/Macros.h>

#include <cstdint>

namespace convnn::kernels {

// A [G, rows, width] tensor whose rows are unit-stride vectors (the kernels vectorise along them);
// the G and row strides are arbitrary, in elements.
template <typename T>
struct RowsView {
  T* data = nullptr;
  int64_t stride_g = 0;
  int64_t stride_row = 0;
  // An empty tensor (width 0, as C = 0) has no storage: its rows are never read, but offsetting a
  // null pointer is undefined behaviour all the same (Clang's UBSan reports it), hence the branch.
  C10_HOST_DEVICE T* row(int64_t g, int64_t r) const {
    return data == nullptr ? data : data + g * stride_g + r * stride_row;
  }
};

// A [G,N,K] tensor of per-slot scalars with arbitrary strides, in elements.
template <typename T>
struct SlotsView {
  T* data = nullptr;
  int64_t stride_g = 0;
  int64_t stride_n = 0;
  int64_t stride_k = 0;
  C10_HOST_DEVICE T& at(int64_t g, int64_t i, int64_t k) const {
    return data[g * stride_g + i * stride_n + k * stride_k];
  }
};

}  // namespace convnn::kernels
