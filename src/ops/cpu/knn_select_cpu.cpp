#include "ops/cpu/knn_select_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include "ops/checks.h"
#include "ops/generic/generic.h"
#include "ops/cpu/knn_select_kernel.h"
#include "ops/reference/reference.h"

namespace convnn::cpu {

namespace {

// keys [G,M,D] as they are when each slice's [M,D] is dense (the slice stride is the kernel's
// keys_slice_stride), else a contiguous copy.
at::Tensor dense_slices(const at::Tensor& keys) {
  const bool dense = (keys.size(2) <= 1 || keys.stride(2) == 1) && (keys.size(1) <= 1 || keys.stride(1) == keys.size(2));
  return dense ? keys : keys.contiguous();
}

}  // namespace

SelectInputs::SelectInputs(const at::Tensor& queries_in, const at::Tensor& keys_in,
                           const c10::optional<at::Tensor>& mask_in, at::ScalarType acc_type)
    : queries(queries_in.contiguous()), keys(dense_slices(keys_in)) {
  if (!mask_in.has_value() || !mask_in->defined()) return;
  mask = mask_in->scalar_type() == at::kBool ? mask_in->contiguous() : mask_in->to(acc_type).contiguous();
}

void report_unrankable(const SelectInputs& in, Similarity similarity,
                       const c10::optional<at::Tensor>& mask, const char* op) {
  checks::check_rankable(reference::ranking_keys(in.queries, in.keys, similarity, mask), op);
  // The outputs are incomplete here, so never return them.
  TORCH_INTERNAL_ASSERT(false, op, ": the fused kernel met a NaN or +inf score that the reference "
                        "ranking did not find");
}

std::tuple<at::Tensor, at::Tensor> knn_select_checked(const Similarity& similarity, const at::Tensor& queries_in,
                                                      const at::Tensor& keys_in, int64_t k, c10::string_view,
                                                      const c10::optional<at::Tensor>& mask_in, bool index_order) {
  const int64_t g = queries_in.size(0), n = queries_in.size(1);
  auto scores = at::empty({g, n, k}, queries_in.options());
  auto indices = at::empty({g, n, k}, queries_in.options().dtype(at::kLong));
  if (scores.numel() == 0) return {scores, indices};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, queries_in.scalar_type(), "knn_select_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const SelectInputs in(queries_in, keys_in, mask_in, c10::CppTypeToScalarType<acc_t>::value);
    const auto p = select_params<scalar_t, acc_t>(in, k, similarity, index_order, scores, indices);
    if (!knn_select_forward(p)) report_unrankable(in, similarity, mask_in, "knn_select");
  });
  return {scores, indices};
}

SelectBackwardTensors::SelectBackwardTensors(const at::Tensor& queries_in, const at::Tensor& keys_in)
    : queries(queries_in.contiguous()),
      keys(keys_in.contiguous()),
      grad_queries(at::empty_like(queries)),
      grad_keys(at::empty_like(keys)) {}

std::tuple<at::Tensor, at::Tensor> knn_select_backward_checked(const Similarity& similarity,
                                                               const at::Tensor& grad_scores,
                                                               const at::Tensor& queries, const at::Tensor& keys,
                                                               const at::Tensor& indices, const at::Tensor& scores,
                                                               c10::string_view) {
  SelectBackwardTensors t(queries, keys);
  if (t.queries.numel() == 0 && t.keys.numel() == 0) return {t.grad_queries, t.grad_keys};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, t.queries.scalar_type(), "knn_select_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    auto p = select_backward_params<scalar_t, acc_t>(t, indices, scores, similarity);
    const auto grad = grad_scores.to(t.queries.scalar_type());
    p.grad_scores = slots_view<const scalar_t>(grad);
    knn_select_backward(p);
  });
  return {t.grad_queries, t.grad_keys};
}

TORCH_LIBRARY_IMPL(convnn, CPU, m) {
  if (ops::generic::serves_cpu()) return;  // CompositeExplicitAutograd takes CPU calls
  op::implement<op::KnnSelect>(m, knn_select);
  op::implement_checked<op::KnnSelectBackward, &knn_select_backward_checked>(m);
}

}  // namespace convnn::cpu
