#pragma once
// The layout rule every device's kernels share: they vectorise along a tensor's last dim and take
// any other strides (slices of a wider projection, the heads of a [B,N,H,d] view), so a tensor is
// copied only where its last dim is not unit-stride.
#include <ATen/core/Tensor.h>

namespace convnn::ops {

/// t where its rows (last dim) are unit-stride, else a contiguous copy.
inline at::Tensor unit_stride_rows(const at::Tensor& t) {
  return t.size(-1) <= 1 || t.stride(-1) == 1 ? t : t.contiguous();
}

}  // namespace convnn::ops
