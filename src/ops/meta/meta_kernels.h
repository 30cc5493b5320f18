#pragma once
// What the Meta kernels of the core ops (src/ops/meta/knn_*.cpp, one file per op) share. A Meta
// kernel is registered behind its op's check with Scope::kShapesOnly (implement_meta below; a meta
// or fake tensor has no values to read), and its body returns outputs with the
// right shapes and dtypes and no data. They make the ops traceable with fake tensors, symbolic sizes
// included (torch.compile with dynamic shapes, opcheck's aot_dispatch_dynamic): sizes are read and
// built as SymInts only (sym_size, sym_sizes, empty_symint), never with sizes(), size(i) or numel(),
// which throw on symbolic sizes. They are also what a call that mixes a meta tensor with a real one
// reaches, so that its device mismatch is reported by name.
#include <ATen/ATen.h>

#include "ops/checks.h"
#include "ops/op_signatures.h"

namespace convnn::meta {

namespace op = ops::op;

// Registers a Meta kernel's body behind its op's check of shapes only.
template <class Op, op::Body<Op>* body>
void implement_meta(torch::Library& m) {
  op::implement_checked<Op, body, checks::Scope::kShapesOnly>(m);
}

// An output a backward's output_mask asked for, or an undefined tensor.
inline at::Tensor empty_if(bool wanted, c10::SymIntArrayRef shape, const at::TensorOptions& options) {
  return wanted ? at::empty_symint(shape, options) : at::Tensor();
}

}  // namespace convnn::meta
