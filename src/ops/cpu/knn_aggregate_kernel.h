#pragma once
// Fused CPU kernels of convnn::knn_aggregate and convnn::knn_aggregate_backward, on the structs of
// ops/kernels/knn_aggregate_params.h (the op's contract on every device). The dispatcher glue in
// knn_aggregate_cpu.cpp validates the tensors and fills the structs; the kernels see raw pointers,
// 64-bit sizes and element strides only. The kernels are compiled once per instruction set
// (ops/cpu/isa.h); the entry points at the end of this header pick one at run time.
#include <ATen/OpMathType.h>
#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "ops/cpu/isa.h"
#include "ops/kernels/knn_aggregate_params.h"

namespace convnn::cpu {

using kernels::AggregateBackwardParams;
using kernels::AggregateForwardParams;
using kernels::AggregateSizes;
using kernels::PreparedForwardKernel;
using kernels::prepared_forward_kernel_size;
using kernels::RowsView;
using kernels::SlotsView;

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
                                    : baseline::prepare_forward_kernel(p, storage);
}

template <typename scalar_t>
void knn_aggregate_forward_kernel(const AggregateForwardParams<scalar_t>& p) {
  runtime_isa() == Isa::Avx2 ? avx2::knn_aggregate_forward_kernel(p)
                             : baseline::knn_aggregate_forward_kernel(p);
}

template <typename scalar_t>
void knn_aggregate_backward_kernel(const AggregateBackwardParams<scalar_t>& p) {
  runtime_isa() == Isa::Avx2 ? avx2::knn_aggregate_backward_kernel(p)
                             : baseline::knn_aggregate_backward_kernel(p);
}

}  // namespace convnn::cpu
