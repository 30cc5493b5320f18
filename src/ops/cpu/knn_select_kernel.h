#pragma once
// Fused similarity + top-k for knn_select on the CPU (knn_select_forward_kernel.cpp) and its
// backward (knn_select_backward_kernel.cpp), on the structs of ops/kernels/knn_select_params.h.
// Never materialises the [G,N,M] score matrix: blocked score tiles feed a running top-K per query
// row.
#include <cstdint>

#include "ops/cpu/isa.h"
#include "ops/kernels/knn_select_params.h"

namespace convnn::cpu {

using kernels::KnnSelectBackwardParams;
using kernels::KnnSelectParams;
using kernels::SlotsView;

CONVNN_DECLARE_CPU_KERNEL(template <typename scalar_t, typename acc_t> void knn_select_backward(
    const KnnSelectBackwardParams<scalar_t, acc_t>& params))

template <typename scalar_t, typename acc_t>
void knn_select_backward(const KnnSelectBackwardParams<scalar_t, acc_t>& params) {
  runtime_isa() == Isa::Avx2 ? avx2::knn_select_backward(params)
                             : baseline::knn_select_backward(params);
}

CONVNN_DECLARE_CPU_KERNEL(template <typename scalar_t, typename acc_t> bool knn_select_forward(
    const KnnSelectParams<scalar_t, acc_t>& params))

// Returns false (outputs unspecified) when a NaN or +inf score was met; the caller reports it.
template <typename scalar_t, typename acc_t>
bool knn_select_forward(const KnnSelectParams<scalar_t, acc_t>& params) {
  return runtime_isa() == Isa::Avx2 ? avx2::knn_select_forward(params)
                                    : baseline::knn_select_forward(params);
}

}  // namespace convnn::cpu
