#pragma once
// The contract of knn_aggregate's kernels on every device: plain structs of raw pointers, 64-bit
// sizes and element strides (views.h), never a torch type, so that the CPU kernels (src/ops/cpu/)
// and a device's twin fill and read the same structs.
//
//   out[g,i,o] = bias[o] + sum_k weights[g,i,k] * (W_k applied to values[g, indices[g,i,k], :])[o]
//
// with W_k = diag(kernel[:,k]) (depthwise, kernel [C,K], C' = C) or kernel[:,:,k] (standard,
// kernel [C',C,K]). Accumulation is in at::opmath_type<scalar_t>: float for float, bfloat16 and
// half, double for double.
#include <ATen/OpMathType.h>
#include <c10/macros/Macros.h>

#include <cstdint>

#include "ops/kernels/views.h"

namespace convnn::kernels {

// values [G,M,C], weights and indices [G,N,K], kernel [C,K] or [C',C,K], output [G,N,C'].
struct AggregateSizes {
  int64_t g = 0;
  int64_t n = 0;
  int64_t m = 0;
  int64_t c = 0;
  int64_t c_out = 0;
  int64_t k = 0;
  bool depthwise = true;
};

// Opmath copies of the kernel in the layouts the forward reads. Without them every forward call
// lays the kernel out itself; a caller that runs the forward on many sub-problems of one problem
// (the fused attention, once per slice) makes them once with prepare_forward_kernel.
template <typename T>
struct PreparedForwardKernel {
  const T* taps_by_channel = nullptr;  // depthwise [K, C]
  const T* flat_by_out = nullptr;      // standard [K*C, C'], query side
  const T* in_by_flat_out = nullptr;   // standard [C, K*C'], value side
};

// Elements of storage that prepare_forward_kernel fills.
inline int64_t prepared_forward_kernel_size(const AggregateSizes& s) {
  return s.depthwise ? s.c * s.k : 2 * s.c_out * s.c * s.k;
}

template <typename scalar_t>
struct AggregateForwardParams {
  AggregateSizes sizes;
  RowsView<const scalar_t> values;    // [G,M,C]
  SlotsView<const scalar_t> weights;  // [G,N,K]
  SlotsView<const int64_t> indices;   // [G,N,K], every entry in [0,M)
  const scalar_t* kernel = nullptr;   // contiguous [C,K] or [C',C,K]
  const scalar_t* bias = nullptr;     // contiguous [C'], or nullptr
  RowsView<scalar_t> out;             // [G,N,C']
  PreparedForwardKernel<at::opmath_type<scalar_t>> prepared;  // optional
};

template <typename scalar_t>
struct AggregateBackwardParams {
  AggregateSizes sizes;
  RowsView<const scalar_t> grad_output;  // [G,N,C']
  RowsView<const scalar_t> values;       // [G,M,C]
  SlotsView<const scalar_t> weights;     // [G,N,K]
  SlotsView<const int64_t> indices;      // [G,N,K], every entry in [0,M)
  const scalar_t* kernel = nullptr;      // contiguous [C,K] or [C',C,K]
  // Outputs: a null data pointer means that gradient is not wanted, and its work is skipped.
  RowsView<scalar_t> grad_values;        // [G,M,C], every row written
  SlotsView<scalar_t> grad_weights;      // [G,N,K], every slot written
  scalar_t* grad_kernel = nullptr;       // contiguous, the kernel's shape
  scalar_t* grad_bias = nullptr;         // contiguous [C']
};

}  // namespace convnn::kernels
