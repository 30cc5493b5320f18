#pragma once
// [A,B,...] -> [A*B,...], contiguous (a copy only where t is not): the fold of the leading dims
// that the ops (head dims) and the layers (heads, masks) share. Not flatten(0, 1) or reshape: under
// tracing their view's stride is min(stride(0), stride(1)), e.g. Min(8*N, 4*N), which PyTorch's
// shape solver cannot simplify, so the next view of the tensor guards on it and fixes the token
// count N. A contiguous tensor's merged view is known instead: the strides of its dimensions 1, 2,
// ... (as_strided keeps its storage offset). Sizes are read as SymInts only.
#include <ATen/core/Tensor.h>

namespace convnn::ops {

inline at::Tensor merge_leading_dims(const at::Tensor& t) {
  const auto c = t.contiguous();
  auto sizes = c.sym_sizes().slice(1).vec();
  sizes[0] *= c.sym_size(0);
  return c.as_strided_symint(sizes, c.sym_strides().slice(1));
}

}  // namespace convnn::ops
