#pragma once
// Input validation shared by every implementation of the core ops (reference, CPU, CUDA), so that
// each backend rejects bad input with the same message: the argument, its value and the rule.
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <string_view>

#include "convnn/ops/rho.h"
#include "convnn/ops/similarity.h"

namespace convnn::checks {

// Shape as "[2, 3, 4]" for error messages.
std::string shape_string(const at::Tensor& t);

// `op` names the caller in the messages (the fused attention op checks its select inputs here).
Similarity check_select_inputs(const at::Tensor& queries, const at::Tensor& keys, int64_t k,
                               std::string_view similarity,
                               const c10::optional<at::Tensor>& mask,
                               std::string_view op = "knn_select");

void check_aggregate_inputs(const at::Tensor& values, const at::Tensor& weights,
                            const at::Tensor& indices, const at::Tensor& kernel,
                            const c10::optional<at::Tensor>& bias);

// values [G,M,C] (floating), kernel [C,k] or [C',k] and bias [C'] of the aggregation, K = k taken
// from `k_source` (named in the message).
void check_kernel_and_bias(const at::Tensor& values, int64_t k, std::string_view k_source,
                           const at::Tensor& kernel, const c10::optional<at::Tensor>& bias,
                           std::string_view op);

struct AttentionChecked {
  Similarity similarity;
  Rho rho;
};

// knn_attention: the select inputs, values [G,M,C] matching keys, kernel and bias, rho by name and
// a positive finite temperature.
AttentionChecked check_attention_inputs(const at::Tensor& queries, const at::Tensor& keys,
                                        const at::Tensor& values, const at::Tensor& kernel,
                                        const c10::optional<at::Tensor>& bias, int64_t k,
                                        std::string_view similarity,
                                        const c10::optional<at::Tensor>& mask,
                                        std::string_view rho, double temperature);

// indices [G,N,K] int64 all in [0, m). `op` and `argument` name the caller in the message.
void check_indices_in_range(const at::Tensor& indices, int64_t m, std::string_view op,
                            std::string_view argument);

// NaN and +inf scores cannot be ranked: -inf means "masked", everything else must be finite.
void check_rankable(const at::Tensor& ranking_keys, std::string_view op);

}  // namespace convnn::checks
