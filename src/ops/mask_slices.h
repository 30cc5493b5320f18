#pragma once
// Which mask slice each query slice reads (docs/operator.md, "Masks"): an [N,M] mask serves every
// slice; a [G',N,M] one, G' dividing G, serves G/G' consecutive slices each, so that a mask per
// sample serves the sample's heads without a copy per head ([B·H,N,D] folds a sample's heads
// together). G' = G is a mask per slice.
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "ops/merge_leading_dims.h"

namespace convnn::ops {

// Query slices per mask slice (1 for a mask of one slice each, or none).
inline int64_t slices_per_mask_slice(const at::Tensor& mask, int64_t slices) {
  if (!mask.defined() || mask.dim() != 3 || mask.size(0) == 0) return 1;
  return slices / mask.size(0);
}

// The mask with a slice for every query slice, for the paths that index it by slice (a copy where
// a slice of it serves several). Sizes as SymInts: the layers call it under tracing too.
inline at::Tensor mask_of_every_slice(const at::Tensor& mask, const c10::SymInt& slices) {
  if (!mask.defined() || mask.dim() != 3) return mask;
  const c10::SymInt mask_slices = mask.sym_size(0);
  if (mask_slices.sym_eq(slices).guard_bool(__FILE__, __LINE__)) return mask;  // one each, or none of none
  return merge_leading_dims(
      mask.unsqueeze(1).expand_symint({mask_slices, slices / mask_slices, mask.sym_size(1), mask.sym_size(2)}));
}

}  // namespace convnn::ops
