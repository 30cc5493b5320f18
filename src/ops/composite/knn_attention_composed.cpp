// knn_attention and its backward on a device with kernels of its own (device_attention,
// device_attention_backward; registered for CUDA by src/ops/cuda/knn_attention_cuda.cpp). Where
// the device has a fused knn_attention kernel for the inputs (convnn::knn_attention_device_fused,
// defined here: on CUDA, the Triton kernel of python/convnn/_triton/attention.py), the forward is
// that one kernel. Otherwise, where the device has kernels of its own for the core ops (on CUDA,
// the Triton kernels of src/ops/cuda/triton/), the attention is their composition through the
// dispatcher, so that a layer on the device runs them (rho and the aggregation after the select in
// one kernel where the device registers convnn::knn_attention_rho_aggregate_device_fused for the
// inputs); where it has none, the device-generic path.
// ATen calls only, no device code: any device with core kernels registers these two functions.
#include "ops/composite/knn_attention_composed.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "convnn/ops/knn_ops.h"
#include "ops/reference/rho_forms.h"
#include "ops/checks.h"
#include "ops/composite/knn_attention_backward.h"
#include "ops/generic/generic.h"
#include "ops/generic/internal.h"

// The device-fused ops a device may register (src/ops/op_signatures.h says what each answers).
TORCH_LIBRARY_FRAGMENT(convnn, m) {
  namespace op = convnn::ops::op;
  op::define<op::KnnAttentionDeviceFused>(m);
  op::define<op::KnnAttentionRhoAggregateDeviceFused>(m);
  op::define<op::KnnAttentionSoftmaxScoresGradientDeviceFused>(m);
  op::define<op::KnnAttentionBackwardDeviceFused>(m);
}

namespace convnn::ops::composite {

std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>> device_fused_attention(
    c10::DispatchKey key, const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
    const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k, c10::string_view similarity,
    const c10::optional<at::Tensor>& mask, bool index_order, c10::string_view rho, double temperature) {
  const auto& fused = op::handle<op::KnnAttentionDeviceFused>();
  if (!fused.hasKernelForDispatchKey(key)) return std::nullopt;
  auto outputs = fused.call(queries, keys, values, kernel, bias, k, similarity, mask, index_order, rho, temperature);
  if (outputs.empty()) return std::nullopt;
  TORCH_CHECK(outputs.size() == 4, "knn_attention_device_fused: a device kernel returned ", outputs.size(),
              " tensors, not the 4 of knn_attention (output, scores, indices, weights)");
  return std::make_tuple(outputs[0], outputs[1], outputs[2], outputs[3]);
}

std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>> device_fused_attention_backward(
    c10::DispatchKey key, const at::Tensor& grad_output, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores, const at::Tensor& indices,
    const at::Tensor& weights, c10::string_view similarity, c10::string_view rho, double temperature,
    std::array<bool, 5> output_mask) {
  const auto& fused = op::handle<op::KnnAttentionBackwardDeviceFused>();
  // Without a query or key gradient to give, the aggregation's backward alone is the whole work.
  if (!fused.hasKernelForDispatchKey(key) || !(output_mask[0] || output_mask[1])) return std::nullopt;
  auto outputs = fused.call(grad_output, queries, keys, values, kernel, scores, indices, weights, similarity, rho,
                           temperature);
  if (outputs.empty()) return std::nullopt;
  TORCH_CHECK(outputs.size() == 5, "knn_attention_backward_device_fused: a device kernel returned ", outputs.size(),
              " tensors, not the 5 gradients of knn_attention_backward");
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    if (!output_mask[i]) outputs[i] = at::Tensor();
  }
  return std::make_tuple(outputs[0], outputs[1], outputs[2], outputs[3], outputs[4]);
}

bool has_device_kernels(c10::DispatchKey key) {
  const auto& select = op::handle<op::KnnSelect>();
  const auto& aggregate = op::handle<op::KnnAggregate>();
  // Either one is worth composing for: the other op then takes the generic path through the
  // dispatcher (a LibTorch build with the embedded Triton kernels has the aggregation's only).
  return select.hasKernelForDispatchKey(key) || aggregate.hasKernelForDispatchKey(key);
}

namespace {

// The device's kernel for rho and the aggregation after the select, where one is registered and
// takes the inputs: (output, weights); nothing otherwise.
std::optional<std::pair<at::Tensor, at::Tensor>> device_fused_rho_aggregate(
    c10::DispatchKey key, const at::Tensor& scores, const at::Tensor& indices, const at::Tensor& values,
    const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, c10::string_view rho, double temperature) {
  const auto& fused = op::handle<op::KnnAttentionRhoAggregateDeviceFused>();
  if (!fused.hasKernelForDispatchKey(key)) return std::nullopt;
  const auto outputs = fused.call(scores, indices, values, kernel, bias, rho, temperature);
  if (outputs.empty()) return std::nullopt;
  TORCH_CHECK(outputs.size() == 2, "knn_attention_rho_aggregate_device_fused: a device kernel returned ",
              outputs.size(), " tensors, not 2 (output, weights)");
  return std::make_pair(outputs[0], outputs[1]);
}

// composed_attention_checked on device `key`, whose kernel for rho and the aggregation after the
// select (convnn::knn_attention_rho_aggregate_device_fused) is asked first.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> composed_attention_on(
    c10::DispatchKey key, const checks::AttentionChecked& checked, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k,
    c10::string_view similarity, const c10::optional<at::Tensor>& mask, bool index_order, c10::string_view rho,
    double temperature) {
  auto [scores, indices] = ops::knn_select(queries, keys, k, std::string(similarity), mask, index_order);
  if (auto fused = device_fused_rho_aggregate(key, scores, indices, values, kernel, bias, rho, temperature)) {
    return {fused->first, scores, indices, fused->second};
  }
  auto weights = reference::rho_weights(scores, checked.rho, temperature);
  // A row the select step could not rank has NaN scores; its weights and output are NaN too, as on the
  // generic path: its weights NaN before the aggregation (softmax makes them so; uniform and mean,
  // which ignore the scores' values, are filled), its output then NaN by the aggregation's arithmetic
  // (a NaN weight times any tap and value, plus any bias). No pass over the output (a masked fill
  // reads and writes all of it: 50 MB at 12 x 16384 bfloat16 heads of 64 channels), and with softmax
  // none over the scores and weights either.
  if (!reference::nan_scores_give_nan_weights(checked.rho)) {
    weights.masked_fill_(scores.isnan().any(-1, /*keepdim=*/true), std::numeric_limits<double>::quiet_NaN());
  }
  auto output = ops::knn_aggregate(values, weights, indices, kernel, bias);
  return {output, scores, indices, weights};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> composed_attention_checked(
    const checks::AttentionChecked& checked, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k,
    c10::string_view similarity, const c10::optional<at::Tensor>& mask, bool index_order, c10::string_view rho,
    double temperature) {
  const auto key = c10::computeDispatchKey(values.scalar_type(), values.layout(), values.device());
  return composed_attention_on(key, checked, queries, keys, values, kernel, bias, k, similarity, mask, index_order,
                               rho, temperature);
}

namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dispatched_aggregate_backward(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask) {
  return ops::knn_aggregate_backward(grad_output, values, weights, indices, kernel, output_mask);
}

std::tuple<at::Tensor, at::Tensor> dispatched_select_backward(
    const at::Tensor& grad_scores, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& indices, const at::Tensor& scores, c10::string_view similarity) {
  return ops::knn_select_backward(grad_scores, queries, keys, indices, scores, std::string(similarity));
}

// The fused kernel of the values' device where one is registered and takes the inputs; undefined
// otherwise.
at::Tensor dispatched_softmax_scores_gradient(const at::Tensor& grad_output, const at::Tensor& values,
                                              const at::Tensor& weights, const at::Tensor& indices,
                                              const at::Tensor& kernel, double temperature) {
  const auto& fused = op::handle<op::KnnAttentionSoftmaxScoresGradientDeviceFused>();
  const auto key = c10::computeDispatchKey(values.scalar_type(), values.layout(), values.device());
  if (!fused.hasKernelForDispatchKey(key)) return {};
  const auto outputs = fused.call(grad_output, values, weights, indices, kernel, temperature);
  TORCH_CHECK(outputs.size() <= 1, "knn_attention_softmax_scores_gradient_device_fused: a device kernel returned ",
              outputs.size(), " tensors, not 0 or 1");
  return outputs.empty() ? at::Tensor() : outputs[0];
}

constexpr composite::AttentionBackwardSteps kDispatchedSteps{
    &dispatched_aggregate_backward, &generic::softmax_rho_backward, &dispatched_select_backward,
    &dispatched_softmax_scores_gradient};

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> composed_attention_backward_checked(
    const checks::AttentionChecked& checked, const at::Tensor& grad_output, const at::Tensor& queries,
    const at::Tensor& keys, const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores,
    const at::Tensor& indices, const at::Tensor& weights, c10::string_view similarity, c10::string_view,
    double temperature, std::array<bool, 5> output_mask) {
  // Per block of query rows, as the generic backward: the select step's per-slot [rows,K,D] tensors
  // stay within the block budget (unblocked, they set a 926 MiB peak at the paper's Table 1
  // configuration on an H100, against the generic path's 340).
  return generic::blocked_attention_backward(kDispatchedSteps, grad_output, queries, keys, values, kernel,
                                             scores, indices, weights, similarity, checked.rho, temperature,
                                             output_mask);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> device_attention(
    c10::DispatchKey key, const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
    const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k, c10::string_view similarity,
    const c10::optional<at::Tensor>& mask, bool index_order, c10::string_view rho, double temperature) {
  // The fused kernel reads [B,H,N,D] inputs in place; the composition takes their [B*H,N,D] folds.
  if (auto fused = device_fused_attention(key, queries, keys, values, kernel, bias, k, similarity, mask, index_order,
                                          rho, temperature)) {
    return *fused;
  }
  return op::head_dims::run(
      [key](const at::Tensor& q, const at::Tensor& k_in, const at::Tensor& v, const at::Tensor& w,
            const c10::optional<at::Tensor>& b, int64_t slots, c10::string_view sim,
            const c10::optional<at::Tensor>& m, bool order, c10::string_view r, double t) {
        // The fused op checked the inputs by knn_attention's rules if it was asked; it declined, so
        // the check runs here, once, for the composition.
        const auto checked =
            op::check<op::KnnAttention>(op::Scope::kShapesAndValues, q, k_in, v, w, b, slots, sim, m, order, r, t);
        if (!has_device_kernels(key)) {
          return generic::knn_attention_checked(checked, q, k_in, v, w, b, slots, sim, m, order, r, t);
        }
        return composed_attention_on(key, checked, q, k_in, v, w, b, slots, sim, m, order, r, t);
      },
      op::Scope::kShapesAndValues, queries, keys, values, kernel, bias, k, similarity, mask, index_order, rho,
      temperature);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> device_attention_backward(
    c10::DispatchKey key, const at::Tensor& grad_output, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores, const at::Tensor& indices,
    const at::Tensor& weights, c10::string_view similarity, c10::string_view rho, double temperature,
    std::array<bool, 5> output_mask) {
  if (auto fused = device_fused_attention_backward(key, grad_output, queries, keys, values, kernel, scores, indices,
                                                   weights, similarity, rho, temperature, output_mask)) {
    return *fused;
  }
  return op::head_dims::run(
      [key](const at::Tensor& dy, const at::Tensor& q, const at::Tensor& k_in, const at::Tensor& v,
            const at::Tensor& w, const at::Tensor& s, const at::Tensor& i, const at::Tensor& p,
            c10::string_view sim, c10::string_view r, double t, std::array<bool, 5> wanted) {
        const auto checked = op::check<op::KnnAttentionBackward>(op::Scope::kShapesAndValues, dy, q, k_in, v, w, s,
                                                                 i, p, sim, r, t, wanted);
        if (!has_device_kernels(key)) {
          return generic::knn_attention_backward_checked(checked, dy, q, k_in, v, w, s, i, p, sim, r, t, wanted);
        }
        return composed_attention_backward_checked(checked, dy, q, k_in, v, w, s, i, p, sim, r, t, wanted);
      },
      op::Scope::kShapesAndValues, grad_output, queries, keys, values, kernel, scores, indices, weights, similarity,
      rho, temperature, output_mask);
}

}  // namespace convnn::ops::composite
