#pragma once
// Input validation shared by every implementation of the core ops (reference, CPU, CUDA), so that
// each backend rejects bad input with the same message: the argument, its value and the rule.
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <string_view>

#include "convnn/ops/similarity.h"

namespace convnn::checks {

// Shape as "[2, 3, 4]" for error messages.
std::string shape_string(const at::Tensor& t);

Similarity check_select_inputs(const at::Tensor& queries, const at::Tensor& keys, int64_t k,
                               std::string_view similarity,
                               const c10::optional<at::Tensor>& mask);

void check_aggregate_inputs(const at::Tensor& values, const at::Tensor& weights,
                            const at::Tensor& indices, const at::Tensor& kernel,
                            const c10::optional<at::Tensor>& bias);

// indices [G,N,K] int64 all in [0, m). `op` and `argument` name the caller in the message.
void check_indices_in_range(const at::Tensor& indices, int64_t m, std::string_view op,
                            std::string_view argument);

// NaN and +inf scores cannot be ranked: -inf means "masked", everything else must be finite.
void check_rankable(const at::Tensor& ranking_keys, std::string_view op);

}  // namespace convnn::checks
