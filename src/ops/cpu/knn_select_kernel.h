#pragma once
// Fused similarity + top-k for knn_select on the CPU. Never materialises the [G,N,M] score matrix:
// blocked score tiles feed a running top-K per query row. Free of torch types (raw pointers,
// 64-bit sizes) so that a CUDA twin can share the parameter struct.
#include <cstdint>

#include "convnn/ops/similarity.h"
#include "ops/cpu/isa.h"

namespace convnn::cpu {

// `scalar_t` is the input dtype; `acc_t` the accumulation type (float, or double for double).
template <typename scalar_t, typename acc_t>
struct KnnSelectParams {
  const scalar_t* queries = nullptr;  // [G,N,D] contiguous
  const scalar_t* keys = nullptr;     // [G,M,D] contiguous
  // At most one mask: bool (true = may be selected) or additive, [N,M] (slice stride 0) or
  // [G,N,M] (slice stride N*M), contiguous.
  const bool* mask_bool = nullptr;
  const acc_t* mask_additive = nullptr;
  int64_t mask_slice_stride = 0;
  int64_t slices = 0;      // G
  int64_t queries_n = 0;   // N
  int64_t keys_m = 0;      // M
  int64_t features = 0;    // D
  int64_t k = 0;           // K
  Similarity similarity = Similarity::Dot;
  bool index_order = false;
  scalar_t* scores = nullptr;  // [G,N,K] out
  int64_t* indices = nullptr;  // [G,N,K] out
};

CONVNN_DECLARE_CPU_KERNEL(template <typename scalar_t, typename acc_t> bool knn_select_forward(
    const KnnSelectParams<scalar_t, acc_t>& params))

// Returns false (outputs unspecified) when a NaN or +inf score was met; the caller reports it.
template <typename scalar_t, typename acc_t>
bool knn_select_forward(const KnnSelectParams<scalar_t, acc_t>& params) {
  return runtime_isa() == Isa::Avx2 ? avx2::knn_select_forward(params)
                                    : generic::knn_select_forward(params);
}

}  // namespace convnn::cpu
