#pragma once
// Glue between tensors and the kernels' plain views (ops/kernels/views.h): the CPU entries
// build every kernel parameter struct through these, so the layout rules live in one place.
#include <ATen/core/Tensor.h>

#include "ops/kernels/views.h"
#include "ops/unit_stride_rows.h"

namespace convnn::cpu {

using kernels::RowsView;
using kernels::SlotsView;

using ops::unit_stride_rows;

// A [G, rows, width] tensor with unit-stride rows (see unit_stride_rows).
template <typename T>
RowsView<T> rows_view(const at::Tensor& t) {
  return {static_cast<T*>(t.data_ptr()), t.stride(0), t.stride(1)};
}

// A [G,N,K] tensor of per-slot scalars, any strides.
template <typename T>
SlotsView<T> slots_view(const at::Tensor& t) {
  return {static_cast<T*>(t.data_ptr()), t.stride(0), t.stride(1), t.stride(2)};
}

}  // namespace convnn::cpu
