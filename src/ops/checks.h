#pragma once
// Input validation shared by every implementation of the core ops (reference, CPU, CUDA), so that
// each backend rejects bad input with the same message: the argument, its value and the rule.
#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>
#include <c10/util/Optional.h>

#include <string_view>

#include "convnn/ops/rho.h"
#include "convnn/ops/similarity.h"

namespace convnn::checks {

// Shape as "[2, 3, 4]" for error messages (a symbolic size prints as its expression, e.g. "s0").
std::string shape_string(const at::Tensor& t);

// What the input checks below look at. Every rule is written once; `scope` only says whether the
// rules that read values run too.
//  - kShapesAndValues: names, ranks, shapes, dtypes and devices, then the values (finiteness, index
//    ranges, the contents of an additive mask; see reads_values_of). The CPU, generic and device
//    kernels.
//  - kShapesOnly: everything but the values. The Meta kernels: a FakeTensor has no values, may
//    report device cpu while it dispatches to Meta, and may have symbolic sizes, on which the shape
//    rules work (they use sym_size/sym_sizes only) and numel() or a read would throw.
enum class Scope { kShapesAndValues, kShapesOnly };

// `op` names the caller in the messages (the fused attention op checks its select inputs here).
Similarity check_select_inputs(const at::Tensor& queries, const at::Tensor& keys, int64_t k,
                               std::string_view similarity,
                               const c10::optional<at::Tensor>& mask,
                               std::string_view op = "knn_select",
                               Scope scope = Scope::kShapesAndValues);

void check_aggregate_inputs(const at::Tensor& values, const at::Tensor& weights,
                            const at::Tensor& indices, const at::Tensor& kernel,
                            const c10::optional<at::Tensor>& bias,
                            std::string_view op = "knn_aggregate",
                            Scope scope = Scope::kShapesAndValues);

// values [G,M,C] (floating), kernel [C,k] or [C',k] and bias [C'] of the aggregation, K = k taken
// from `k_source` (named in the message). Shapes only.
void check_kernel_and_bias(const at::Tensor& values, const c10::SymInt& k,
                           std::string_view k_source, const at::Tensor& kernel,
                           const c10::optional<at::Tensor>& bias, std::string_view op);

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
                                        std::string_view rho, double temperature,
                                        std::string_view op = "knn_attention",
                                        Scope scope = Scope::kShapesAndValues);

// knn_attention's rho and aggregation after its select (a device's fused step of the composition):
// scores [G,N,K] of values' dtype and device, then knn_aggregate's rules with the scores in the
// weights' place, rho by name and a positive finite temperature.
Rho check_rho_aggregate_inputs(const at::Tensor& scores, const at::Tensor& indices, const at::Tensor& values,
                               const at::Tensor& kernel, const c10::optional<at::Tensor>& bias,
                               std::string_view rho, double temperature, std::string_view op,
                               Scope scope = Scope::kShapesAndValues);

// C' of the aggregation: C for a depthwise kernel [C,K], kernel.size(0) for a standard [C',C,K].
// The SymInt form serves the Meta kernels, whose sizes may be symbolic.
c10::SymInt output_channels_symint(const at::Tensor& values, const at::Tensor& kernel);
int64_t output_channels(const at::Tensor& values, const at::Tensor& kernel);

// The backward ops: the forward's checks under the backward op's name, plus the tensors the
// forward saved (indices, scores, weights: [G,N,k]) and the incoming gradient.
Similarity check_select_backward_inputs(const at::Tensor& grad_scores, const at::Tensor& queries,
                                        const at::Tensor& keys, const at::Tensor& indices,
                                        const at::Tensor& scores, std::string_view similarity,
                                        Scope scope = Scope::kShapesAndValues);
void check_aggregate_backward_inputs(const at::Tensor& grad_output, const at::Tensor& values,
                                     const at::Tensor& weights, const at::Tensor& indices,
                                     const at::Tensor& kernel,
                                     std::string_view op = "knn_aggregate_backward",
                                     Scope scope = Scope::kShapesAndValues);
AttentionChecked check_attention_backward_inputs(
    const at::Tensor& grad_output, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores,
    const at::Tensor& indices, const at::Tensor& weights, std::string_view similarity,
    std::string_view rho, double temperature, Scope scope = Scope::kShapesAndValues);

// The softmax temperature: finite and at least the smallest normal float32 (about 1.2e-38), the
// accumulation type of float32, bfloat16 and float16 inputs; below it the temperature is a
// denormal or 0 there. Every temperature from there up gives finite weights (the hard max in the
// limit). `where` names the caller, e.g. "knn_attention".
void check_temperature(double temperature, std::string_view where);

// Checks that read values (finiteness, index ranges, mask contents) run where reading a value
// costs nothing: on CPU tensors, always. On an accelerator each read would stall the host until
// the device catches up, on every call (and a CUDA graph cannot capture it), so there they run
// only when CONVNN_DEVICE_VALUE_CHECKS=1 is set (a debugging switch: the CPU's messages, at the
// price of a synchronisation per check). Without it a NaN or +inf input makes the rows it cannot
// rank come out NaN (the generic path's settle_unrankable_rows), and an out-of-range index fails
// ATen's device-side bounds check. CONVNN_DEVICE_VALUE_CHECKS=0 reads no values on any device,
// CPU included: what an accelerator does by default, so that the CPU tests can run it. Meta
// tensors have shapes but no values and always pass, and under torch.vmap no value can be read.
// The Meta kernels do not get here at all: they check with Scope::kShapesOnly (a FakeTensor may
// report device cpu, so this test cannot tell).
bool reads_values_of(const at::Tensor& t);
// Whether CONVNN_DEVICE_VALUE_CHECKS=1 asks every device, accelerators included, to read values:
// the paths that cannot raise on what they would read (the Triton kernels) step aside then.
bool reads_values_everywhere();

// indices [G,N,K] int64 all in [0, m). `op` and `argument` name the caller in the message.
void check_indices_in_range(const at::Tensor& indices, int64_t m, std::string_view op,
                            std::string_view argument);

// Queries and keys must be finite: a NaN cannot be ranked, and an infinite feature makes every
// score of its row NaN or infinite (+inf with a +inf query under gaussian looked "masked"). The
// message names `argument` and the first bad position.
void check_finite(const at::Tensor& t, std::string_view op, std::string_view argument);

// NaN and +inf scores cannot be ranked: -inf means "masked", everything else must be finite.
void check_rankable(const at::Tensor& ranking_keys, std::string_view op);

}  // namespace convnn::checks
