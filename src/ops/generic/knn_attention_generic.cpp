// Generic knn_attention and its backward (src/ops/generic/generic.h): per block of query rows the
// select step, rho and the aggregation, so neither the [G,N,M] scores nor all the gathered
// neighbourhoods exist at once. The backward is the shared composition
// (ops/composite/knn_attention_backward.h) of the generic steps, also per block of query rows, so
// its per-slot [rows,K,C] tensors stay within the block budget too.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>

#include "ops/reference/rho_forms.h"
#include "ops/checks.h"
#include "ops/composite/knn_attention_backward.h"
#include "ops/generic/generic.h"
#include "ops/generic/internal.h"

namespace convnn::ops::generic {

at::Tensor softmax_rho_backward(const at::Tensor& weights, const at::Tensor& grad_weights,
                                double temperature) {
  const auto acc = at::toOpMathType(weights.scalar_type());
  const auto w = weights.to(acc), g = grad_weights.to(acc);
  const auto centred = g - (w * g).sum(-1, /*keepdim=*/true);
  return (w * centred).div_(temperature).to(weights.scalar_type());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_checked(
    const checks::AttentionChecked& checked, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k,
    c10::string_view, const c10::optional<at::Tensor>& mask, bool index_order, c10::string_view,
    double temperature) {
  const int64_t g = queries.size(0), n = queries.size(1);
  auto scores = at::empty({g, n, k}, queries.options());
  auto indices = at::empty({g, n, k}, queries.options().dtype(at::kLong));
  auto weights = at::empty({g, n, k}, queries.options());
  auto output = at::empty({g, n, checks::output_channels(values, kernel)}, values.options());
  SelectOperands in(queries, keys, mask, checked.similarity);
  const int64_t bytes_per_row = keys.size(1) * select_bytes_per_score(in.queries.scalar_type()) +
                                aggregate_bytes_per_row(values, k, kernel);
  for_each_row_block(g, n, bytes_per_row, [&](const RowBlock& block) {
    const auto [block_scores, block_indices] = select_block(in, k, index_order, block);
    // rho sees the scores as returned (in the inputs' dtype), as in the composed ops.
    auto reported = block_of(scores, block);
    reported.copy_(block_scores);
    const auto block_weights = reference::rho_weights(reported, checked.rho, temperature);
    block_of(indices, block).copy_(block_indices);
    block_of(weights, block).copy_(block_weights);
    block_of(output, block).copy_(aggregate_block(values.narrow(0, block.slice, block.slices),
                                                  block_weights, block_indices, kernel, bias));
  });
  settle_unrankable_rows(in, "knn_attention", {output, scores, weights});
  return {output, scores, indices, weights};
}

namespace {

// Bytes the backward keeps live per query row of one slice: about eight per-slot tensors of K
// channels in the accumulation type (the gathered neighbourhoods, the gradient pulled back through
// the kernel, their products, the pair gradients and the inverse index's sorted copy), and the
// int64 sort keys and order of the inverse index.
int64_t backward_bytes_per_row(const at::Tensor& queries, const at::Tensor& values,
                               const at::Tensor& kernel, int64_t k) {
  const int64_t widest = std::max({queries.size(2), values.size(2), checks::output_channels(values, kernel)});
  const int64_t element = c10::elementSize(at::toOpMathType(values.scalar_type()));
  return 8 * k * widest * element + 4 * k * static_cast<int64_t>(sizeof(int64_t));
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> blocked_attention_backward(
    const composite::AttentionBackwardSteps& steps, const at::Tensor& grad_output, const at::Tensor& queries,
    const at::Tensor& keys, const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores,
    const at::Tensor& indices, const at::Tensor& weights, c10::string_view similarity, Rho rho,
    double temperature, std::array<bool, 5> output_mask) {
  const int64_t k = indices.size(2);
  if (queries.size(0) == 0 || queries.size(1) == 0) {  // no rows to block: the zero gradients
    return composite::knn_attention_backward(steps, grad_output, queries, keys, values, kernel, scores,
                                             indices, weights, similarity, rho, temperature, output_mask);
  }
  BlockedGradient grad_queries, grad_keys, grad_values, grad_kernel, grad_bias;
  const auto bias_like = at::empty({checks::output_channels(values, kernel)}, values.options());
  for_each_row_block(queries.size(0), queries.size(1), backward_bytes_per_row(queries, values, kernel, k),
                     [&](const RowBlock& block) {
    const auto slices = [&](const at::Tensor& t) { return t.narrow(0, block.slice, block.slices); };
    const auto [gq, gk, gv, gkernel, gbias] = composite::knn_attention_backward(
        steps, block_of(grad_output, block), block_of(queries, block), slices(keys), slices(values), kernel,
        block_of(scores, block), block_of(indices, block), block_of(weights, block), similarity, rho,
        temperature, output_mask);
    grad_queries.copy_rows(gq, queries, block);
    grad_keys.add_slices(gk, keys, block);
    grad_values.add_slices(gv, values, block);
    grad_kernel.add_whole(gkernel, kernel);
    grad_bias.add_whole(gbias, bias_like);
  });
  return {grad_queries.result(), grad_keys.result(), grad_values.result(), grad_kernel.result(),
          grad_bias.result()};
}

namespace {

// knn_attention_backward checked every input of the steps (grad_scores is softmax_rho_backward's
// own result): they are the ops' bodies, which skip the checks their ops would repeat per block.
std::tuple<at::Tensor, at::Tensor> select_backward_step(const at::Tensor& grad_scores, const at::Tensor& queries,
                                                        const at::Tensor& keys, const at::Tensor& indices,
                                                        const at::Tensor& scores, c10::string_view similarity) {
  return knn_select_backward_checked(parse_similarity(similarity), grad_scores, queries, keys, indices, scores,
                                     similarity);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_backward_checked(
    const checks::AttentionChecked& checked, const at::Tensor& grad_output, const at::Tensor& queries,
    const at::Tensor& keys, const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores,
    const at::Tensor& indices, const at::Tensor& weights, c10::string_view similarity, c10::string_view,
    double temperature, std::array<bool, 5> output_mask) {
  // The generic steps, called directly: a direct call on CPU tensors stays on this path.
  static constexpr composite::AttentionBackwardSteps kGenericSteps{
      &knn_aggregate_backward_checked, &softmax_rho_backward, &select_backward_step};
  return blocked_attention_backward(kGenericSteps, grad_output, queries, keys, values, kernel, scores, indices,
                                    weights, similarity, checked.rho, temperature, output_mask);
}

TORCH_LIBRARY_IMPL(convnn, CompositeExplicitAutograd, m) {
  op::implement<op::KnnAttention>(m, knn_attention);
  op::implement<op::KnnAttentionBackward>(m, knn_attention_backward);
}

}  // namespace convnn::ops::generic
