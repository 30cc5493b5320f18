#pragma once
// kernels::Arith for ATen's CPU vectors, so that a similarity policy's accumulate runs on whole
// vectors in the fused CPU kernels. Included only by per-ISA kernel files (ops/cpu/isa.h): each
// sees the Vectorized of its own instruction set.
#include <ATen/cpu/vec/vec.h>

#include "ops/kernels/similarity.h"

namespace convnn::kernels {

template <typename T>
struct Arith<at::vec::Vectorized<T>> {
  using V = at::vec::Vectorized<T>;
  static V fmadd(const V& a, const V& b, const V& c) { return at::vec::fmadd(a, b, c); }
  static V abs(const V& x) { return x.abs(); }
  // at::vec::maximum propagates NaN, so a NaN coordinate is reported as unrankable.
  static V maximum(const V& a, const V& b) { return at::vec::maximum(a, b); }
};

}  // namespace convnn::kernels
