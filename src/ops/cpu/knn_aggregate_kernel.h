#pragma once
// Fused CPU kernels of convnn::knn_aggregate and convnn::knn_aggregate_backward.
//
// The op is split in three layers (docs: DESIGN.md §4): the dispatcher glue in knn_ops_cpu.cpp
// validates the tensors and fills the plain structs below; the kernels see raw pointers, 64-bit
// sizes and element strides only, never a torch type, so that a CUDA twin can share the structs
// and the index math (the views are host/device-callable).
//
//   out[g,i,o] = bias[o] + sum_k weights[g,i,k] * (W_k applied to values[g, indices[g,i,k], :])[o]
//
// with W_k = diag(kernel[:,k]) (depthwise, kernel [C,K], C' = C) or kernel[:,:,k] (standard,
// kernel [C',C,K]). Accumulation is in at::opmath_type<scalar_t>: float for float, bfloat16 and
// half, double for double. The kernels are compiled once per instruction set (ops/cpu/isa.h);
// the entry points at the end of this header pick one at run time.
#include <ATen/OpMathType.h>
#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "ops/cpu/isa.h"
#include "ops/cpu/kernel_views.h"

namespace convnn::cpu {

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

// Both kernels are deterministic: the result does not depend on the number of threads (it may
// differ between instruction sets). Instantiated for double, float, c10::BFloat16 and c10::Half.
CONVNN_DECLARE_CPU_KERNEL(template <typename scalar_t> PreparedForwardKernel<at::opmath_type<scalar_t>>
                              prepare_forward_kernel(const AggregateForwardParams<scalar_t>& p,
                                                     at::opmath_type<scalar_t>* storage))
CONVNN_DECLARE_CPU_KERNEL(template <typename scalar_t> void knn_aggregate_forward_kernel(
    const AggregateForwardParams<scalar_t>& p))
CONVNN_DECLARE_CPU_KERNEL(template <typename scalar_t> void knn_aggregate_backward_kernel(
    const AggregateBackwardParams<scalar_t>& p))

// Fills `storage` (prepared_forward_kernel_size elements) from p.kernel and points into it.
template <typename scalar_t>
PreparedForwardKernel<at::opmath_type<scalar_t>> prepare_forward_kernel(
    const AggregateForwardParams<scalar_t>& p, at::opmath_type<scalar_t>* storage) {
  return runtime_isa() == Isa::Avx2 ? avx2::prepare_forward_kernel(p, storage)
                                    : generic::prepare_forward_kernel(p, storage);
}

template <typename scalar_t>
void knn_aggregate_forward_kernel(const AggregateForwardParams<scalar_t>& p) {
  runtime_isa() == Isa::Avx2 ? avx2::knn_aggregate_forward_kernel(p)
                             : generic::knn_aggregate_forward_kernel(p);
}

template <typename scalar_t>
void knn_aggregate_backward_kernel(const AggregateBackwardParams<scalar_t>& p) {
  runtime_isa() == Isa::Avx2 ? avx2::knn_aggregate_backward_kernel(p)
                             : generic::knn_aggregate_backward_kernel(p);
}

}  // namespace convnn::cpu
