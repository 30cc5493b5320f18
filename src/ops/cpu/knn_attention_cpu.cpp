// CPU kernels of knn_attention and its backward (checked as src/ops/op_signatures.h says): dtype
// dispatch and the fused kernel of ops/cpu/knn_attention_kernel.h. The backward is the shared composition
// (ops/composite/knn_attention_backward.h) of the fused CPU steps: each needs only the [G,N,K]
// scores, indices and weights that the forward returned.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

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

// Opens the shared inverse-index slot (shared_inverse_index.h) on this thread for one backward
// call, and closes it after, whatever leaves the call.
class ShareInverseIndex {
 public:
  ShareInverseIndex() : previous_(shared_inverse_index) { shared_inverse_index = &slot_; }
  ~ShareInverseIndex() { shared_inverse_index = previous_; }
  ShareInverseIndex(const ShareInverseIndex&) = delete;
  ShareInverseIndex& operator=(const ShareInverseIndex&) = delete;

 private:
  SharedInverseIndex slot_;
  SharedInverseIndex* previous_;
};

constexpr ops::composite::AttentionBackwardSteps kCpuSteps{
    &knn_aggregate_backward_checked, &softmax_rho_backward_cpu, &select_backward_cpu};

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_backward_checked(
    const checks::AttentionChecked& checked, const at::Tensor& grad_output, const at::Tensor& queries,
    const at::Tensor& keys, const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores,
    const at::Tensor& indices, const at::Tensor& weights, c10::string_view similarity, c10::string_view,
    double temperature, std::array<bool, 5> output_mask) {
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
