#pragma once
// grid_coordinates, draw_candidates and causal_mask (convnn/nn/functional/convnn.h) and the head
// folding on SymInt sizes: the forms the layer composites call, which torch.compile and
// torch.export trace with symbolic batch, token and spatial sizes. The public int64 functions call
// these, so each rule has one implementation; on concrete sizes a SymInt is a plain int.
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>
#include <c10/core/SymIntArrayRef.h>
#include <c10/util/Optional.h>

#include "ops/merge_leading_dims.h"

namespace convnn::nn::functional::detail {

at::Tensor grid_coordinates_symint(c10::SymIntArrayRef sizes, const at::TensorOptions& options);

at::Tensor draw_candidates_symint(const c10::SymInt& m, int64_t r, c10::optional<at::Generator> generator,
                                  const at::Device& device);

at::Tensor causal_mask_symint(const c10::SymInt& n, const at::Device& device);

// [A,B,...] -> [A*B,...], contiguous: the ops' rule (src/ops/merge_leading_dims.h says why not
// flatten or reshape).
using ops::merge_leading_dims;

// [B,N,H*d] -> [B*H,N,d], the layers' head folding (the benchmarks' reference paths use it too).
// One head is a view of x, more a contiguous copy.
at::Tensor fold_heads(const at::Tensor& x, int64_t heads);

// [B*H,N,d] -> [B,N,H*d]
at::Tensor unfold_heads(const at::Tensor& x, int64_t heads);

}  // namespace convnn::nn::functional::detail
