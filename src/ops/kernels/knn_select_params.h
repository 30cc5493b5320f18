#pragma once
// The contract of knn_select's kernels on every device: plain structs of raw pointers and 64-bit
// sizes (views.h), never a torch type. The similarity's rules are its policy (similarity.h).
#include <cstdint>

#include "convnn/ops/similarity.h"
#include "ops/kernels/views.h"

namespace convnn::kernels {

// `scalar_t` is the input dtype; `acc_t` the accumulation type (float, or double for double).
template <typename scalar_t, typename acc_t>
struct KnnSelectParams {
  const scalar_t* queries = nullptr;  // [G,N,D] contiguous
  // [G,M,D]: each slice's [M,D] dense, slices keys_slice_stride elements apart (M*D when the whole
  // tensor is contiguous; more for slices of a longer buffer, a key/value cache, read in place).
  const scalar_t* keys = nullptr;
  int64_t keys_slice_stride = 0;
  // At most one mask: bool (true = may be selected) or additive, contiguous: [N,M] (slice stride
  // 0), or [G',N,M] (slice stride N*M), G' dividing G: slice g reads mask slice g / (G/G')
  // (ops/mask_slices.h).
  const bool* mask_bool = nullptr;
  const acc_t* mask_additive = nullptr;
  int64_t mask_slice_stride = 0;
  int64_t slices_per_mask_slice = 1;
  // Slices of the first mask slice before this call's first (a block of the call's slices).
  int64_t mask_slice_phase = 0;
  // Where slice g's mask starts, in elements.
  int64_t mask_slice_offset(int64_t g) const {
    return (g + mask_slice_phase) / slices_per_mask_slice * mask_slice_stride;
  }
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

// The backward recomputes only the K selected similarities: d(queries) per query row, d(keys)
// through the inverse index (deterministic, no atomics). Masked slots (score -inf) get no gradient.
template <typename scalar_t, typename acc_t>
struct KnnSelectBackwardParams {
  const scalar_t* queries = nullptr;       // [G,N,D] contiguous
  const scalar_t* keys = nullptr;          // [G,M,D] contiguous
  SlotsView<const int64_t> indices;        // [G,N,K] in [0,M)
  SlotsView<const scalar_t> grad_scores;   // [G,N,K]
  SlotsView<const scalar_t> scores;        // [G,N,K], -inf marks a masked slot
  int64_t slices = 0, queries_n = 0, keys_m = 0, features = 0, k = 0;
  Similarity similarity = Similarity::Dot;
  scalar_t* grad_queries = nullptr;        // [G,N,D] contiguous out
  scalar_t* grad_keys = nullptr;           // [G,M,D] contiguous out
};

}  // namespace convnn::kernels
