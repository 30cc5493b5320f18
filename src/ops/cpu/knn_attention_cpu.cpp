// CPU kernels of knn_attention and its backward (checked as src/ops/op_signatures.h says): dtype
// dispatch and the fused kernels of ops/cpu/knn_attention_kernel.h. The backward of float and
// double over enough slices is one kernel by tasks of whole slices; the rest is the shared
// composition (ops/composite/knn_attention_backward.h) of the fused CPU steps. Either needs only the
// [G,N,K] scores, indices and weights that the forward returned.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <optional>

#include "convnn/ops/knn_ops.h"
#include "ops/checks.h"
#include "ops/composite/knn_attention_backward.h"
#include "ops/generic/generic.h"
#include "ops/cpu/knn_aggregate_cpu.h"
#include "ops/cpu/knn_attention_kernel.h"
#include "ops/cpu/knn_select_cpu.h"
#include "ops/cpu/shared_inverse_index.h"

namespace convnn::cpu {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_checked(
    const checks::AttentionChecked& checked, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k,
    c10::string_view, const c10::optional<at::Tensor>& mask, bool index_order, c10::string_view,
    double temperature) {
  const int64_t g = queries.size(0), n = queries.size(1);
  const AggregateSizes sizes = aggregate_sizes(values, n, k, kernel);
  auto scores = at::empty({g, n, k}, queries.options());
  auto indices = at::empty({g, n, k}, queries.options().dtype(at::kLong));
  auto weights = at::empty({g, n, k}, queries.options());
  auto output = at::empty({g, n, sizes.c_out}, values.options());
  if (scores.numel() == 0) return {output, scores, indices, weights};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, queries.scalar_type(), "knn_attention_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const SelectInputs select_inputs(queries, keys, mask, c10::CppTypeToScalarType<acc_t>::value);
    const AggregateForwardInputs aggregate_inputs(values, kernel, bias);
    KnnAttentionParams<scalar_t, acc_t> p;
    p.select = select_params<scalar_t, acc_t>(select_inputs, k, checked.similarity, index_order, scores,
                                              indices);
    p.aggregate = aggregate_forward_params<scalar_t>(sizes, aggregate_inputs, weights, indices, output);
    p.rho = checked.rho;
    p.temperature = static_cast<acc_t>(temperature);
    p.weights = weights.mutable_data_ptr<scalar_t>();
    if (!knn_attention_forward(p)) {
      report_unrankable(select_inputs, checked.similarity, mask, "knn_attention");
    }
  });
  return {output, scores, indices, weights};
}

// The fused CPU steps of the shared composition (src/ops/composite/knn_attention_backward.h).
at::Tensor softmax_rho_backward_cpu(const at::Tensor& weights, const at::Tensor& grad_weights,
                                    double temperature) {
  const auto weights_dense = weights.contiguous(), grad_weights_dense = grad_weights.contiguous();
  auto grad_scores = at::empty(weights.sizes(), weights.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, weights.scalar_type(), "softmax_rho_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    softmax_rho_backward(weights_dense.const_data_ptr<scalar_t>(), grad_weights_dense.const_data_ptr<scalar_t>(),
                         weights.size(0) * weights.size(1), weights.size(2), static_cast<acc_t>(temperature),
                         grad_scores.mutable_data_ptr<scalar_t>());
  });
  return grad_scores;
}

// knn_attention_backward checked every input of these steps (grad_scores is softmax_rho_backward's
// own result): they are the ops' bodies, which skip the checks their ops would repeat.
std::tuple<at::Tensor, at::Tensor> select_backward_cpu(const at::Tensor& grad_scores, const at::Tensor& queries,
                                                       const at::Tensor& keys, const at::Tensor& indices,
                                                       const at::Tensor& scores, c10::string_view similarity) {
  return knn_select_backward_checked(parse_similarity(similarity), grad_scores, queries, keys, indices, scores,
                                     similarity);
}

// The backward in one kernel, by tasks of whole slices (knn_attention_kernel.h).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_backward_by_slices(
    const checks::AttentionChecked& checked, const at::Tensor& grad_output, const at::Tensor& queries,
    const at::Tensor& keys, const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores,
    const at::Tensor& indices, const at::Tensor& weights, double temperature, std::array<bool, 5> output_mask) {
  // Named variables, not a structured binding: C++17 lambdas cannot capture those (Clang refuses).
  const bool want_queries = output_mask[0], want_keys = output_mask[1];
  // As the composition: uniform and mean rho have no score gradient, and no d(weights) to pay.
  const bool score_gradient = (want_queries || want_keys) && rho_has_score_gradient(checked.rho);
  const AggregateSizes sizes = aggregate_sizes(values, indices.size(1), indices.size(2), kernel);
  AggregateBackwardTensors aggregate(sizes, grad_output, values, kernel,
                                     {output_mask[2], /*weights: the kernel's own*/ false, output_mask[3], output_mask[4]});
  const auto weights_dense = weights.contiguous();
  std::optional<SelectBackwardTensors> select;
  if (score_gradient) select.emplace(queries, keys);
  AT_DISPATCH_FLOATING_TYPES(queries.scalar_type(), "knn_attention_backward_cpu", [&] {
    KnnAttentionBackwardParams<scalar_t, scalar_t> p;
    p.aggregate = aggregate_backward_params<scalar_t>(sizes, aggregate, weights_dense, indices);
    if (score_gradient) {
      p.select = select_backward_params<scalar_t, scalar_t>(*select, indices, scores, checked.similarity);
    }
    p.weights = weights_dense.const_data_ptr<scalar_t>();
    p.temperature = static_cast<scalar_t>(temperature);
    p.score_gradient = score_gradient;
    knn_attention_backward(p);
  });
  at::Tensor grad_queries, grad_keys;
  if (want_queries && score_gradient) grad_queries = select->grad_queries;
  if (want_keys && score_gradient) grad_keys = select->grad_keys;
  return {grad_queries, grad_keys, aggregate.grad_values, aggregate.grad_kernel, aggregate.grad_bias};
}

constexpr ops::composite::AttentionBackwardSteps kCpuSteps{
    &knn_aggregate_backward_checked, &softmax_rho_backward_cpu, &select_backward_cpu};

// Float and double over enough slices take the one kernel; the rest, the composition of the fused
// steps, which share one inverse index (shared_inverse_index.h).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_backward_checked(
    const checks::AttentionChecked& checked, const at::Tensor& grad_output, const at::Tensor& queries,
    const at::Tensor& keys, const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores,
    const at::Tensor& indices, const at::Tensor& weights, c10::string_view similarity, c10::string_view,
    double temperature, std::array<bool, 5> output_mask) {
  const bool one_kernel = (queries.scalar_type() == at::kFloat || queries.scalar_type() == at::kDouble) &&
                          attention_backward_splits_by_slices(queries.size(0)) && indices.numel() > 0 &&
                          values.numel() > 0;
  if (one_kernel) {
    return knn_attention_backward_by_slices(checked, grad_output, queries, keys, values, kernel, scores, indices,
                                            weights, temperature, output_mask);
  }
  const ShareInverseIndex share;
  return ops::composite::knn_attention_backward(kCpuSteps, grad_output, queries, keys, values, kernel,
                                                scores, indices, weights, similarity, checked.rho,
                                                temperature, output_mask);
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, CPU, m) {
  if (ops::generic::serves_cpu()) return;  // CompositeExplicitAutograd takes CPU calls
  ops::op::implement_checked<ops::op::KnnAttention, &knn_attention_checked>(m);
  ops::op::implement_checked<ops::op::KnnAttentionBackward, &knn_attention_backward_checked>(m);
}

}  // namespace convnn::cpu
