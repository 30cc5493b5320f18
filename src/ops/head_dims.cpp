// knn_attention and its backward on [B,H,N,D] inputs (src/ops/op_signatures.h, "Heads as a dimension
// of their own"): the rules of that layout, and the fold that runs a kernel of [G,N,D] slices on it.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <string>
#include <utility>

#include "ops/checks.h"
#include "ops/merge_leading_dims.h"
#include "ops/op_signatures.h"

namespace convnn::ops::op::head_dims {
namespace {

using checks::shape_string;

constexpr const char* kAttention = "knn_attention";
constexpr const char* kBackward = "knn_attention_backward";

// Whether the call has head dims: queries, keys and values all 4-D. Any of them above 3-D with the
// others not all 4-D is refused here, with the layouts the op takes; below that, the [G,N,D] checks
// of the folded kernel say what is wrong.
bool has_head_dims(const Tensor& queries, const Tensor& keys, const Tensor& values, const char* op) {
  const auto rank = [](const Tensor& t) { return t.defined() ? t.dim() : int64_t{0}; };
  const bool any_above = rank(queries) > 3 || rank(keys) > 3 || rank(values) > 3;
  if (!any_above) return false;
  TORCH_CHECK(rank(queries) == 4 && rank(keys) == 4 && rank(values) == 4, op,
              ": queries, keys and values must be all 3-D [G,N,D] or all 4-D [B,H,N,D] (heads as a dimension), "
              "got queries ", queries.defined() ? shape_string(queries) : "undefined", ", keys ",
              keys.defined() ? shape_string(keys) : "undefined", ", values ",
              values.defined() ? shape_string(values) : "undefined");
  return true;
}

// The call's [B,H] (from the queries), which every tensor with a slice dim must have.
struct Heads {
  c10::SymInt batch, heads;
};

void check_same_heads(const Heads& h, const Tensor& t, const char* op, const char* name, const char* layout) {
  TORCH_CHECK(t.defined(), op, ": ", name, " must be a defined tensor");
  TORCH_CHECK(t.dim() == 4, op, ": with head dims, ", name, " must be 4-D ", layout, ", got ", shape_string(t));
  TORCH_SYM_CHECK(t.sym_size(0).sym_eq(h.batch).sym_and(t.sym_size(1).sym_eq(h.heads)), op, ": ", name, " ",
                  shape_string(t), " must have the queries' [B,H] = [", h.batch, ",", h.heads, "] in dims 0 and 1");
}

Heads attention_heads(const Tensor& queries, const Tensor& keys, const Tensor& values, const char* op) {
  const Heads h{queries.sym_size(0), queries.sym_size(1)};
  check_same_heads(h, keys, op, "keys", "[B,H,M,D]");
  check_same_heads(h, values, op, "values", "[B,H,M,C]");
  return h;
}

Heads backward_heads(const Tensor& grad_output, const Tensor& queries, const Tensor& keys, const Tensor& values,
                     const Tensor& scores, const Tensor& indices, const Tensor& weights) {
  const auto h = attention_heads(queries, keys, values, kBackward);
  check_same_heads(h, grad_output, kBackward, "grad_output", "[B,H,N,C]");
  check_same_heads(h, scores, kBackward, "scores", "[B,H,N,K]");
  check_same_heads(h, indices, kBackward, "indices", "[B,H,N,K]");
  check_same_heads(h, weights, kBackward, "weights", "[B,H,N,K]");
  return h;
}

// [B,H,rows,width] -> [B*H,rows,width]: merge_leading_dims (a copy only where t is not contiguous);
// fresh tensors of that shape when only shapes are checked (see run in op_signatures.h).
Tensor fold(const Tensor& t, Scope scope) {
  if (scope != Scope::kShapesOnly) return merge_leading_dims(t);
  return at::empty_symint({t.sym_size(0) * t.sym_size(1), t.sym_size(2), t.sym_size(3)}, t.options());
}

// The fold a check sees: `fold`, or a fresh tensor of its shape where the check reads no value of it.
Tensor fold_for_check(const Tensor& t, Scope scope) {
  return fold(t, scope == Scope::kShapesAndValues && checks::reads_values_of(t) ? scope : Scope::kShapesOnly);
}

// A mask broadcasts over [B,H] as scaled_dot_product_attention broadcasts it: [B,H,N,M] folds to one
// slice per (b, h); [B,1,N,M] (per sample) to one per sample, which the op reads for each of the
// sample's heads (ops/mask_slices.h); [1,1,N,M] is the shared [N,M]; [1,H,N,M] (per head, the same
// for every sample) is repeated for each sample, a copy of its B·H·N·M entries (the op's mask slices
// serve consecutive query slices, so none can serve one head of every sample).
OptionalTensor fold_mask(const Heads& h, const OptionalTensor& mask, Scope scope, const char* op) {
  if (!mask.has_value() || !mask->defined() || mask->dim() == 2) return mask;
  TORCH_CHECK(mask->dim() == 4, op,
              ": with head dims, mask must be 2-D [N,M] (shared) or 4-D [B,H,N,M], [B,1,N,M], [1,H,N,M] or "
              "[1,1,N,M] (broadcast over the queries' [B,H] as in scaled_dot_product_attention), got ",
              shape_string(*mask));
  const c10::SymInt& batch = mask->sym_size(0);
  const c10::SymInt& heads = mask->sym_size(1);
  TORCH_SYM_CHECK(batch.sym_eq(h.batch).sym_or(batch.sym_eq(1)).sym_and(
                      heads.sym_eq(h.heads).sym_or(heads.sym_eq(1))),
                  op, ": mask ", shape_string(*mask), " must have the queries' B = ", h.batch,
                  " or 1 in dim 0 and their H = ", h.heads, " or 1 in dim 1 (to broadcast over [B,H])");
  if (batch.sym_eq(h.batch).guard_bool(__FILE__, __LINE__)) return fold(*mask, scope);
  if (heads.sym_eq(1).guard_bool(__FILE__, __LINE__)) return mask->select(0, 0).select(0, 0);
  return fold(mask->expand_symint({h.batch, heads, mask->sym_size(2), mask->sym_size(3)}), scope);
}

// [B*H,N,width] (contiguous, as every kernel's outputs) -> [B,H,N,width], a view.
Tensor unfold(const Heads& h, const Tensor& t) {
  if (!t.defined()) return t;
  return t.view_symint({h.batch, h.heads, t.sym_size(1), t.sym_size(2)});
}

// [B*H,rows,width] -> [B,H,rows,width] stored as [B,rows,H,width] (the output, and the gradients of
// queries, keys and values: their [B,rows,H*width] forms are views). Made from canonical strides on
// every path (at::empty, clone to Contiguous), so that a Meta kernel's strides are the real ones
// even where a dim is 1; an undefined gradient stays undefined.
Tensor heads_inside_tokens(const Heads& h, const Tensor& t, Scope scope) {
  if (!t.defined()) return t;
  const c10::SymInt rows = t.sym_size(1), width = t.sym_size(2);
  if (scope == Scope::kShapesOnly) return at::empty_symint({h.batch, rows, h.heads, width}, t.options()).transpose(1, 2);
  return unfold(h, t).transpose(1, 2).clone(at::MemoryFormat::Contiguous).transpose(1, 2);
}

// Errors of the folded call name the folded shapes: say which ones the caller passed.
template <class Call>
auto with_fold_context(const char* op, const Tensor& queries, Call&& call) {
  try {
    return std::forward<Call>(call)();
  } catch (c10::Error& e) {
    e.add_context(c10::str(op, " ran on the [B,H,N,D] inputs as [B*H,N,D] slices (queries ", shape_string(queries),
                           ")"));
    throw;
  }
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor> run(c10::function_ref<KnnAttention::Signature> folded_kernel,
                                               Scope scope, const Tensor& queries, const Tensor& keys,
                                               const Tensor& values, const Tensor& kernel, const OptionalTensor& bias,
                                               int64_t k, c10::string_view similarity, const OptionalTensor& mask,
                                               bool index_order, c10::string_view rho, double temperature) {
  if (!has_head_dims(queries, keys, values, kAttention)) {
    return folded_kernel(queries, keys, values, kernel, bias, k, similarity, mask, index_order, rho, temperature);
  }
  const auto h = attention_heads(queries, keys, values, kAttention);
  const auto folded_mask = fold_mask(h, mask, scope, kAttention);
  auto [output, scores, indices, weights] = with_fold_context(kAttention, queries, [&] {
    return folded_kernel(fold(queries, scope), fold(keys, scope), fold(values, scope), kernel, bias, k, similarity,
                         folded_mask, index_order, rho, temperature);
  });
  return {heads_inside_tokens(h, output, scope), unfold(h, scores), unfold(h, indices), unfold(h, weights)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> run(
    c10::function_ref<KnnAttentionBackward::Signature> folded_kernel, Scope scope, const Tensor& grad_output,
    const Tensor& queries, const Tensor& keys, const Tensor& values, const Tensor& kernel, const Tensor& scores,
    const Tensor& indices, const Tensor& weights, c10::string_view similarity, c10::string_view rho,
    double temperature, std::array<bool, 5> output_mask) {
  if (!has_head_dims(queries, keys, values, kBackward)) {
    return folded_kernel(grad_output, queries, keys, values, kernel, scores, indices, weights, similarity, rho,
                         temperature, output_mask);
  }
  const auto h = backward_heads(grad_output, queries, keys, values, scores, indices, weights);
  auto [grad_queries, grad_keys, grad_values, grad_kernel, grad_bias] = with_fold_context(kBackward, queries, [&] {
    return folded_kernel(fold(grad_output, scope), fold(queries, scope), fold(keys, scope), fold(values, scope),
                         kernel, fold(scores, scope), fold(indices, scope), fold(weights, scope), similarity, rho,
                         temperature, output_mask);
  });
  return {heads_inside_tokens(h, grad_queries, scope), heads_inside_tokens(h, grad_keys, scope),
          heads_inside_tokens(h, grad_values, scope), grad_kernel, grad_bias};
}

checks::AttentionChecked check_folded(Scope scope, const Tensor& queries, const Tensor& keys, const Tensor& values,
                                      const Tensor& kernel, const OptionalTensor& bias, int64_t k,
                                      c10::string_view similarity, const OptionalTensor& mask, bool index_order,
                                      c10::string_view rho, double temperature) {
  if (!has_head_dims(queries, keys, values, kAttention)) {
    return check<KnnAttention>(scope, queries, keys, values, kernel, bias, k, similarity, mask, index_order, rho,
                               temperature);
  }
  const auto h = attention_heads(queries, keys, values, kAttention);
  // The mask's layout checked, and its values folded where the check reads them (as fold_for_check).
  const bool values_read = mask.has_value() && mask->defined() && scope == Scope::kShapesAndValues &&
                           checks::reads_values_of(*mask);
  const OptionalTensor folded_mask = fold_mask(h, mask, values_read ? scope : Scope::kShapesOnly, kAttention);
  return with_fold_context(kAttention, queries, [&] {
    return check<KnnAttention>(scope, fold_for_check(queries, scope), fold_for_check(keys, scope),
                               fold_for_check(values, scope), kernel, bias, k, similarity, folded_mask, index_order,
                               rho, temperature);
  });
}

checks::AttentionChecked check_folded(Scope scope, const Tensor& grad_output, const Tensor& queries,
                                      const Tensor& keys, const Tensor& values, const Tensor& kernel,
                                      const Tensor& scores, const Tensor& indices, const Tensor& weights,
                                      c10::string_view similarity, c10::string_view rho, double temperature) {
  constexpr std::array<bool, 5> kAll{true, true, true, true, true};  // the backward's check reads no mask
  if (!has_head_dims(queries, keys, values, kBackward)) {
    return check<KnnAttentionBackward>(scope, grad_output, queries, keys, values, kernel, scores, indices, weights,
                                       similarity, rho, temperature, kAll);
  }
  backward_heads(grad_output, queries, keys, values, scores, indices, weights);
  const auto folded = [&](const Tensor& t) { return fold_for_check(t, scope); };
  return with_fold_context(kBackward, queries, [&] {
    return check<KnnAttentionBackward>(scope, folded(grad_output), folded(queries), folded(keys), folded(values),
                                       kernel, folded(scores), folded(indices), folded(weights), similarity, rho,
                                       temperature, kAll);
  });
}

}  // namespace convnn::ops::op::head_dims
