#pragma once
// knn_attention and its backward on a device with kernels of its own, in ATen calls only
// (src/ops/composite/knn_attention_composed.cpp): a device registers device_attention and
// device_attention_backward as its knn_attention kernels (CUDA: src/ops/cuda/knn_attention_cuda.cpp).
#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKey.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <array>
#include <optional>
#include <tuple>

#include "ops/op_signatures.h"

namespace convnn::ops::composite {

// Whether the device has kernels of its own for knn_select and knn_aggregate (on CUDA, the Triton
// route's). Asked at every call: they may be registered after the first one.
bool has_device_kernels(c10::DispatchKey key);

// The device's fused knn_attention forward (convnn::knn_attention_device_fused) for these inputs;
// nothing where the device has no such kernel or it does not take the inputs. The device's kernel
// checks the inputs by knn_attention's rules before anything else (it is registered checked).
std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>> device_fused_attention(
    c10::DispatchKey key, const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
    const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k, c10::string_view similarity,
    const c10::optional<at::Tensor>& mask, bool index_order, c10::string_view rho, double temperature);

// The device's whole knn_attention backward (convnn::knn_attention_backward_device_fused) for these
// inputs (its kernel checks them by knn_attention_backward's rules), with the gradients output_mask
// does not ask for undefined; nothing where the device has no such kernel, it does not take the
// inputs, or neither a query nor a key gradient is asked for.
std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>> device_fused_attention_backward(
    c10::DispatchKey key, const at::Tensor& grad_output, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores, const at::Tensor& indices,
    const at::Tensor& weights, c10::string_view similarity, c10::string_view rho, double temperature,
    std::array<bool, 5> output_mask);

// knn_select -> rho -> knn_aggregate through the dispatcher, each step the device's kernel (the
// same arguments and results as convnn::knn_attention; each step is an op call of its own, checked
// as such). Takes tensors of any device, so that the tests can run it on the CPU. The body takes
// knn_attention's checked facts (src/ops/op_signatures.h); composed_attention checks first.
op::Body<op::KnnAttention> composed_attention_checked;
inline constexpr auto composed_attention = op::checked_kernel<op::KnnAttention, &composed_attention_checked>;

// Its backward: the shared composition (ops/composite) of the dispatched aggregation and select
// backward ops and the generic softmax-rho backward, per block of query rows as the generic one.
op::Body<op::KnnAttentionBackward> composed_attention_backward_checked;
inline constexpr auto composed_attention_backward =
    op::checked_kernel<op::KnnAttentionBackward, &composed_attention_backward_checked>;

// knn_attention on device `key`. The device's fused kernel, asked first, checks the inputs before it
// answers: where it takes them, that is the call's one check. Where it declines, or the device has
// none, they are checked here (after a decline, a second time) before the composition of the core
// ops (where the device has a kernel of its own for either) or the device-generic path.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> device_attention(
    c10::DispatchKey key, const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
    const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k, c10::string_view similarity,
    const c10::optional<at::Tensor>& mask, bool index_order, c10::string_view rho, double temperature);

// Its backward, chosen the same way.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> device_attention_backward(
    c10::DispatchKey key, const at::Tensor& grad_output, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores, const at::Tensor& indices,
    const at::Tensor& weights, c10::string_view similarity, c10::string_view rho, double temperature,
    std::array<bool, 5> output_mask);

}  // namespace convnn::ops::composite
