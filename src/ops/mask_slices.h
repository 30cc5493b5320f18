#pragma once
// Which mask slice each query slice reads (docs/operator.md, "Masks"): an [N,M] mask serves every
// slice; a [G',N,M] one, G' dividing G, serves G/G' consecutive slices each, so that a mask per
// sample serves the sample's heads without a copy per head ([B·H,N,D] folds a sample's heads
// together). G' = G is a mask per slice.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace convnn::ops {

// Query slices per mask slice (1 for a mask of one slice each, or none).
inline int64_t slices_per_mask_slice(const at::Tensor& mask, int64_t slices) {
  if (!mask.defined() || mask.dim() != 3 || mask.size(0) == 0) return 1;
  return slices / mask.size(0);
}

// The mask with a slice for every query slice, for the paths that index it by slice (a copy where
// a slice of it serves several).
inline at::Tensor mask_of_every_slice(const at::Tensor& mask, int64_t slices) {
  const int64_t repeats = slices_per_mask_slice(mask, slices);
  if (repeats == 1) return mask;
  return mask.unsqueeze(1).expand({mask.size(0), repeats, mask.size(1), mask.size(2)}).reshape({slices, mask.size(1),
                                                                                              mask.size(2)});
}

}  // namespace convnn::ops
