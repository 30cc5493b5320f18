#pragma once
// Each core op in one place: its name, its schema, the C++ type that every dispatch key's kernel
// has, and the check its inputs pass. The schema is defined from here (define), every kernel is
// registered through implement, which takes only a function of exactly Op::Signature, and the C++
// entry points call the op through handle<Op>(), so a kernel whose parameters drift from its op's
// does not compile. (PyTorch also compares each kernel's inferred schema with the defined one when
// the library loads.)
//
// Checked once per call: a device kernel is registered as checked_kernel<Op, body>, which runs
// check<Op> once and hands what it established (Op::Checked: the parsed similarity, rho) to the
// body. Bodies call one another directly, so a composite kernel (the attention backward's steps,
// per block of rows) never checks its inputs a second time. The Autograd and Autocast kernels
// redispatch and check nothing themselves.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/FunctionRef.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "ops/checks.h"

namespace convnn::ops::op {

using Tensor = at::Tensor;
using OptionalTensor = c10::optional<at::Tensor>;
using checks::Scope;

struct KnnSelect {
  static constexpr const char* kName = "knn_select";
  static constexpr const char* kSchema =
      "knn_select(Tensor queries, Tensor keys, int k, str similarity, Tensor? mask, bool index_order) -> "
      "(Tensor scores, Tensor indices)";
  using Signature = std::tuple<Tensor, Tensor>(const Tensor& queries, const Tensor& keys, int64_t k,
                                               c10::string_view similarity, const OptionalTensor& mask,
                                               bool index_order);
  using Checked = Similarity;
  static Checked check(Scope scope, const Tensor& queries, const Tensor& keys, int64_t k,
                       c10::string_view similarity, const OptionalTensor& mask, bool /*index_order*/) {
    return checks::check_select_inputs(queries, keys, k, similarity, mask, kName, scope);
  }
};

struct KnnSelectBackward {
  static constexpr const char* kName = "knn_select_backward";
  static constexpr const char* kSchema =
      "knn_select_backward(Tensor grad_scores, Tensor queries, Tensor keys, Tensor indices, Tensor scores, "
      "str similarity) -> (Tensor grad_queries, Tensor grad_keys)";
  using Signature = std::tuple<Tensor, Tensor>(const Tensor& grad_scores, const Tensor& queries,
                                               const Tensor& keys, const Tensor& indices, const Tensor& scores,
                                               c10::string_view similarity);
  using Checked = Similarity;
  static Checked check(Scope scope, const Tensor& grad_scores, const Tensor& queries, const Tensor& keys,
                       const Tensor& indices, const Tensor& scores, c10::string_view similarity) {
    return checks::check_select_backward_inputs(grad_scores, queries, keys, indices, scores, similarity, scope);
  }
};

struct KnnAggregate {
  static constexpr const char* kName = "knn_aggregate";
  static constexpr const char* kSchema =
      "knn_aggregate(Tensor values, Tensor weights, Tensor indices, Tensor kernel, Tensor? bias) -> Tensor";
  using Signature = Tensor(const Tensor& values, const Tensor& weights, const Tensor& indices,
                           const Tensor& kernel, const OptionalTensor& bias);
  using Checked = void;  // the check establishes nothing a body needs beyond the inputs
  static void check(Scope scope, const Tensor& values, const Tensor& weights, const Tensor& indices,
                    const Tensor& kernel, const OptionalTensor& bias) {
    checks::check_aggregate_inputs(values, weights, indices, kernel, bias, kName, scope);
  }
};

struct KnnAggregateBackward {
  static constexpr const char* kName = "knn_aggregate_backward";
  static constexpr const char* kSchema =
      "knn_aggregate_backward(Tensor grad_output, Tensor values, Tensor weights, Tensor indices, Tensor kernel, "
      "bool[4] output_mask) -> (Tensor grad_values, Tensor grad_weights, Tensor grad_kernel, Tensor grad_bias)";
  using Signature = std::tuple<Tensor, Tensor, Tensor, Tensor>(const Tensor& grad_output, const Tensor& values,
                                                               const Tensor& weights, const Tensor& indices,
                                                               const Tensor& kernel, std::array<bool, 4> output_mask);
  using Checked = void;
  static void check(Scope scope, const Tensor& grad_output, const Tensor& values, const Tensor& weights,
                    const Tensor& indices, const Tensor& kernel, std::array<bool, 4> /*output_mask*/) {
    checks::check_aggregate_backward_inputs(grad_output, values, weights, indices, kernel, kName, scope);
  }
};

struct KnnAttention {
  static constexpr const char* kName = "knn_attention";
  static constexpr const char* kSchema =
      "knn_attention(Tensor queries, Tensor keys, Tensor values, Tensor kernel, Tensor? bias, int k, "
      "str similarity, Tensor? mask, bool index_order, str rho, float temperature) -> "
      "(Tensor output, Tensor scores, Tensor indices, Tensor weights)";
  using Signature = std::tuple<Tensor, Tensor, Tensor, Tensor>(
      const Tensor& queries, const Tensor& keys, const Tensor& values, const Tensor& kernel,
      const OptionalTensor& bias, int64_t k, c10::string_view similarity, const OptionalTensor& mask,
      bool index_order, c10::string_view rho, double temperature);
  using Checked = checks::AttentionChecked;
  static Checked check(Scope scope, const Tensor& queries, const Tensor& keys, const Tensor& values,
                       const Tensor& kernel, const OptionalTensor& bias, int64_t k, c10::string_view similarity,
                       const OptionalTensor& mask, bool /*index_order*/, c10::string_view rho, double temperature) {
    return checks::check_attention_inputs(queries, keys, values, kernel, bias, k, similarity, mask, rho,
                                          temperature, kName, scope);
  }
};

struct KnnAttentionBackward {
  static constexpr const char* kName = "knn_attention_backward";
  static constexpr const char* kSchema =
      "knn_attention_backward(Tensor grad_output, Tensor queries, Tensor keys, Tensor values, Tensor kernel, "
      "Tensor scores, Tensor indices, Tensor weights, str similarity, str rho, float temperature, "
      "bool[5] output_mask) -> (Tensor grad_queries, Tensor grad_keys, Tensor grad_values, Tensor grad_kernel, "
      "Tensor grad_bias)";
  using Signature = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>(
      const Tensor& grad_output, const Tensor& queries, const Tensor& keys, const Tensor& values,
      const Tensor& kernel, const Tensor& scores, const Tensor& indices, const Tensor& weights,
      c10::string_view similarity, c10::string_view rho, double temperature, std::array<bool, 5> output_mask);
  using Checked = checks::AttentionChecked;
  static Checked check(Scope scope, const Tensor& grad_output, const Tensor& queries, const Tensor& keys,
                       const Tensor& values, const Tensor& kernel, const Tensor& scores, const Tensor& indices,
                       const Tensor& weights, c10::string_view similarity, c10::string_view rho, double temperature,
                       std::array<bool, 5> /*output_mask*/) {
    return checks::check_attention_backward_inputs(grad_output, queries, keys, values, kernel, scores, indices,
                                                   weights, similarity, rho, temperature, scope);
  }
};

// A device's single-kernel forward, asked first by that device's knn_attention kernel, which leaves
// the inputs' check to it (knn_attention's): the four outputs, or no tensors for inputs it does not
// take (the caller checks and composes then).
struct KnnAttentionDeviceFused {
  static constexpr const char* kName = "knn_attention_device_fused";
  static constexpr const char* kSchema =
      "knn_attention_device_fused(Tensor queries, Tensor keys, Tensor values, Tensor kernel, Tensor? bias, "
      "int k, str similarity, Tensor? mask, bool index_order, str rho, float temperature) -> Tensor[]";
  using Signature = std::vector<Tensor>(const Tensor& queries, const Tensor& keys, const Tensor& values,
                                        const Tensor& kernel, const OptionalTensor& bias, int64_t k,
                                        c10::string_view similarity, const OptionalTensor& mask, bool index_order,
                                        c10::string_view rho, double temperature);
  using Checked = KnnAttention::Checked;
  static constexpr auto check = &KnnAttention::check;
};

// rho and the aggregation of knn_attention's composed forward in one device kernel, after the
// select: [output, weights], or no tensors for inputs it does not take (the caller composes rho and
// knn_aggregate then); asked by the composition of the device's knn_attention.
struct KnnAttentionRhoAggregateDeviceFused {
  static constexpr const char* kName = "knn_attention_rho_aggregate_device_fused";
  static constexpr const char* kSchema =
      "knn_attention_rho_aggregate_device_fused(Tensor scores, Tensor indices, Tensor values, Tensor kernel, "
      "Tensor? bias, str rho, float temperature) -> Tensor[]";
  using Signature = std::vector<Tensor>(const Tensor& scores, const Tensor& indices, const Tensor& values,
                                        const Tensor& kernel, const OptionalTensor& bias, c10::string_view rho,
                                        double temperature);
  using Checked = Rho;
  static Checked check(Scope scope, const Tensor& scores, const Tensor& indices, const Tensor& values,
                       const Tensor& kernel, const OptionalTensor& bias, c10::string_view rho, double temperature) {
    return checks::check_rho_aggregate_inputs(scores, indices, values, kernel, bias, rho, temperature, kName, scope);
  }
};

// d(scores) for softmax rho from the incoming gradient of the output in one device kernel,
// [grad_scores] or no tensors; asked by the composition of the device's knn_attention_backward.
struct KnnAttentionSoftmaxScoresGradientDeviceFused {
  static constexpr const char* kName = "knn_attention_softmax_scores_gradient_device_fused";
  static constexpr const char* kSchema =
      "knn_attention_softmax_scores_gradient_device_fused(Tensor grad_output, Tensor values, Tensor weights, "
      "Tensor indices, Tensor kernel, float temperature) -> Tensor[]";
  using Signature = std::vector<Tensor>(const Tensor& grad_output, const Tensor& values, const Tensor& weights,
                                        const Tensor& indices, const Tensor& kernel, double temperature);
  using Checked = void;
  static void check(Scope scope, const Tensor& grad_output, const Tensor& values, const Tensor& weights,
                    const Tensor& indices, const Tensor& kernel, double /*temperature*/) {
    // The aggregation backward's rules, under its name: the kernel replaces that op's weights gradient.
    checks::check_aggregate_backward_inputs(grad_output, values, weights, indices, kernel,
                                            KnnAggregateBackward::kName, scope);
  }
};

// The device's whole knn_attention backward where it has one for the inputs: all five gradients,
// or no tensors; asked first by the device's knn_attention_backward, which leaves the inputs' check
// to it (knn_attention_backward's).
struct KnnAttentionBackwardDeviceFused {
  static constexpr const char* kName = "knn_attention_backward_device_fused";
  static constexpr const char* kSchema =
      "knn_attention_backward_device_fused(Tensor grad_output, Tensor queries, Tensor keys, Tensor values, "
      "Tensor kernel, Tensor scores, Tensor indices, Tensor weights, str similarity, str rho, float temperature) "
      "-> Tensor[]";
  using Signature = std::vector<Tensor>(const Tensor& grad_output, const Tensor& queries, const Tensor& keys,
                                        const Tensor& values, const Tensor& kernel, const Tensor& scores,
                                        const Tensor& indices, const Tensor& weights, c10::string_view similarity,
                                        c10::string_view rho, double temperature);
  using Checked = checks::AttentionChecked;
  static Checked check(Scope scope, const Tensor& grad_output, const Tensor& queries, const Tensor& keys,
                       const Tensor& values, const Tensor& kernel, const Tensor& scores, const Tensor& indices,
                       const Tensor& weights, c10::string_view similarity, c10::string_view rho, double temperature) {
    return checks::check_attention_backward_inputs(grad_output, queries, keys, values, kernel, scores, indices,
                                                   weights, similarity, rho, temperature, scope);
  }
};

// ---- Heads as a dimension of their own ----------------------------------------------------------
// knn_attention and its backward also take [B,H,N,D] queries, keys and values (any strides, as the
// head-split views of a [B,N,3C] projection), as scaled_dot_product_attention does: each (b, h) is
// a slice g = b*H + h. The rules (src/ops/head_dims.cpp, docs/operator.md "Heads as a dimension"):
// every tensor with a slice dim has [B,H] there (a mask [N,M], [B,H,N,M] or [B,1,N,M]); scores, indices and
// weights are [B,H,N,K] and contiguous; the output is [B,H,N,C] stored as [B,N,H,C] (its
// transpose(1, 2).flatten(2) is the [B,N,H*C] the layer's output projection reads, without a copy);
// the gradients of queries, keys and values have their shapes, stored likewise ([B,N,H,D]: the
// layer's [B,N,H*D] gradients are views).
// - kFoldsHeadDims: the op's kernels take [G,N,D] slices; on [B,H,N,D] inputs they run on the
//   [B*H,N,D] folds (a copy only where a fold is not a view): head_dims::run.
// - kReadsHeadDims: the kernel's body reads [B,H,N,D] inputs in place (the CUDA fused kernels);
//   its check runs on the folds' shapes: head_dims::check_folded.
template <class Op>
inline constexpr bool kFoldsHeadDims = false;
template <>
inline constexpr bool kFoldsHeadDims<KnnAttention> = true;
template <>
inline constexpr bool kFoldsHeadDims<KnnAttentionBackward> = true;
template <class Op>
inline constexpr bool kReadsHeadDims = false;
template <>
inline constexpr bool kReadsHeadDims<KnnAttentionDeviceFused> = true;
template <>
inline constexpr bool kReadsHeadDims<KnnAttentionBackwardDeviceFused> = true;

namespace head_dims {
// `folded_kernel` (a kernel for [G,N,D] slices) on the call's arguments: directly for [G,N,D]
// inputs, on their [B*H,N,D] folds for [B,H,N,D] ones, with the results in the layouts above.
// `scope` kShapesOnly (a Meta kernel) folds to fresh tensors of the folded shapes: nothing reads
// them, and a fold of a fake tensor's strided view would guard on its symbolic sizes.
std::tuple<Tensor, Tensor, Tensor, Tensor> run(c10::function_ref<KnnAttention::Signature> folded_kernel,
                                               Scope scope, const Tensor& queries, const Tensor& keys,
                                               const Tensor& values, const Tensor& kernel, const OptionalTensor& bias,
                                               int64_t k, c10::string_view similarity, const OptionalTensor& mask,
                                               bool index_order, c10::string_view rho, double temperature);
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> run(
    c10::function_ref<KnnAttentionBackward::Signature> folded_kernel, Scope scope, const Tensor& grad_output,
    const Tensor& queries, const Tensor& keys, const Tensor& values, const Tensor& kernel, const Tensor& scores,
    const Tensor& indices, const Tensor& weights, c10::string_view similarity, c10::string_view rho,
    double temperature, std::array<bool, 5> output_mask);

// The op's check (knn_attention's, or its backward's) of [G,N,D] inputs, or of [B,H,N,D] ones: their
// layout rules, then the check of their folds, which are fresh tensors of the folded shapes unless
// the check reads the values (checks::reads_values_of: then the folds themselves).
checks::AttentionChecked check_folded(Scope scope, const Tensor& queries, const Tensor& keys, const Tensor& values,
                                      const Tensor& kernel, const OptionalTensor& bias, int64_t k,
                                      c10::string_view similarity, const OptionalTensor& mask, bool index_order,
                                      c10::string_view rho, double temperature);
checks::AttentionChecked check_folded(Scope scope, const Tensor& grad_output, const Tensor& queries,
                                      const Tensor& keys, const Tensor& values, const Tensor& kernel,
                                      const Tensor& scores, const Tensor& indices, const Tensor& weights,
                                      c10::string_view similarity, c10::string_view rho, double temperature);
}  // namespace head_dims

// ---- Declaring, registering and calling -------------------------------------------------------

template <class Op>
void define(torch::Library& m) {
  m.def(Op::kSchema);
}

// The only way a kernel is registered: `kernel` must be a function of exactly the op's Signature.
template <class Op>
void implement(torch::Library& m, typename Op::Signature* kernel) {
  m.impl(Op::kName, kernel);
}

// The op through the dispatcher, typed by its Signature (found once per process).
template <class Op>
const c10::TypedOperatorHandle<typename Op::Signature>& handle() {
  static const auto typed = c10::Dispatcher::singleton()
                                .findSchemaOrThrow((std::string("convnn::") + Op::kName).c_str(), "")
                                .template typed<typename Op::Signature>();
  return typed;
}

// Checks run on this thread so far, counted by check<Op>: the tests count them to prove that a
// call is checked once.
inline thread_local int64_t checks_on_this_thread = 0;

// Op::check under `scope`, counted. Every check of an op's inputs goes through here.
template <class Op, class... Args>
decltype(auto) check(Scope scope, const Args&... args) {
  ++checks_on_this_thread;
  return Op::check(scope, args...);
}

template <class Op, class Signature = typename Op::Signature>
struct Kernel;

template <class Op, class Result, class... Args>
struct Kernel<Op, Result(Args...)> {
  // A kernel's body: the op's arguments after what its check established (nothing before them
  // when the check establishes nothing).
  using Body = std::conditional_t<std::is_void_v<typename Op::Checked>, Result(Args...),
                                  Result(const std::conditional_t<std::is_void_v<typename Op::Checked>, int,
                                                                  typename Op::Checked>&,
                                         Args...)>;

  template <Body* body, Scope scope>
  static Result checked_once(Args... args) {
    if constexpr (kFoldsHeadDims<Op>) return head_dims::run(&checked_slices<body, scope>, scope, args...);
    if constexpr (kReadsHeadDims<Op>) return body(head_dims::check_folded(scope, args...), args...);
    return checked_slices<body, scope>(args...);
  }

  template <Body* body, Scope scope>
  static Result checked_slices(Args... args) {
    if constexpr (std::is_void_v<typename Op::Checked>) {
      check<Op>(scope, args...);
      return body(args...);
    } else {
      return body(check<Op>(scope, args...), args...);
    }
  }
};

template <class Op>
using Body = typename Kernel<Op>::Body;

// The kernel to register for `body`: Op::check under `scope` (Meta kernels check shapes only),
// then `body`. Also what a direct C++ call of one implementation goes through.
template <class Op, Body<Op>* body, Scope scope = Scope::kShapesAndValues>
inline constexpr typename Op::Signature* checked_kernel = &Kernel<Op>::template checked_once<body, scope>;

// Registers checked_kernel<Op, body, scope>: the usual registration of a device kernel.
template <class Op, Body<Op>* body, Scope scope = Scope::kShapesAndValues>
void implement_checked(torch::Library& m) {
  implement<Op>(m, checked_kernel<Op, body, scope>);
}

}  // namespace convnn::ops::op
