#include "ops/cuda/triton/first_call_check.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <array>
#include <tuple>
#include <utility>

#include "ops/cuda/triton/aggregate_launches.h"
#include "ops/cuda/triton/attention_launches.h"
#include "ops/cuda/triton/blocks.h"
#include "ops/cuda/triton/select_launches.h"
#include "ops/generic/generic.h"

namespace convnn::ops::cuda::triton {
namespace {

bool close(const at::Tensor& got, const at::Tensor& want, double tolerance) {
  return at::allclose(got.to(at::kFloat), want.to(at::kFloat), tolerance, tolerance);
}

std::optional<std::string> aggregate_check(const c10::Device& device, at::ScalarType dtype, double tolerance,
                                           const LaunchRunner& run) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(0);
  const int64_t g = 2, n = 7, m = 9, c = 5, k = 3;
  const auto on_device = at::TensorOptions().device(device).dtype(dtype);
  const auto draw = [&](at::IntArrayRef shape) { return at::randn(shape, generator).to(on_device); };
  const auto values = draw({g, m, c}), weights = draw({g, n, k});
  const auto indices = at::randint(0, m, {g, n, k}, generator).to(device);
  for (const bool standard : {false, true}) {
    const auto kernel = standard ? draw({c + 2, c, k}) : draw({c, k});
    const auto bias = draw({kernel.size(0)});
    const auto grad_output = draw({g, n, kernel.size(0)});
    const char* kind = standard ? "standard" : "depthwise";
    if (!close(aggregate_forward(values, weights, indices, kernel, bias, run),
               generic::knn_aggregate(values, weights, indices, kernel, bias), tolerance)) {
      return std::string("knn_aggregate (") + kind + ", forward)";
    }
    const std::array<bool, 4> all{true, true, true, true};
    const auto fused = aggregate_backward(grad_output, values, weights, indices, kernel, all, run);
    const auto expected = generic::knn_aggregate_backward(grad_output, values, weights, indices, kernel, all);
    const std::array<std::pair<const char*, bool>, 4> agree{
        {{"values", close(std::get<0>(fused), std::get<0>(expected), tolerance)},
         {"weights", close(std::get<1>(fused), std::get<1>(expected), tolerance)},
         {"kernel", close(std::get<2>(fused), std::get<2>(expected), tolerance)},
         {"bias", close(std::get<3>(fused), std::get<3>(expected), tolerance)}}};
    for (const auto& [name, same] : agree) {
      if (!same) return std::string("knn_aggregate_backward (") + kind + ", d " + name + ")";
    }
  }
  return std::nullopt;
}

// Integer-valued features: every score exact on every path, ties included, so the indices must be
// equal; the scores to rounding (a distance's is Triton's exp, not the C++ one).
std::optional<std::string> select_check(const c10::Device& device, at::ScalarType dtype, double tolerance,
                                        const LaunchRunner& run) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1);
  const auto on_device = at::TensorOptions().device(device).dtype(dtype);
  const auto queries = at::randint(-3, 4, {2, 9, 5}, generator).to(on_device);
  const auto keys = at::randint(-3, 4, {2, 70, 5}, generator).to(on_device);
  const auto mask = (at::rand({9, 70}, generator) > 0.3).to(device);
  const double score_tolerance = dtype == at::kFloat ? 1e-5 : 1e-2;
  // Dot and l1 by the IEEE kernel, and dot by tensor cores with its exact re-rank (with and without
  // the mask), on keys of which 40 are one row repeated: more ties than a queue's flush settles at
  // once. The tensor-core kernel reads rows of whole chunks of features: these padded with zeros to
  // 16 (the same scores); a float32 call with a mask takes the IEEE kernel (no tensor-core kernel).
  auto tied_keys = keys.clone();
  tied_keys.narrow(1, 20, 40).fill_(1);
  const auto padded = [&](const at::Tensor& t) {
    return at::constant_pad_nd(t, {0, kBoundedSelectBlocks.features - t.size(-1)});
  };
  const auto wide_queries = padded(queries), wide_tied_keys = padded(tied_keys);
  const at::Tensor no_mask;
  const std::tuple<Similarity, SelectScores, const at::Tensor*, const at::Tensor*, const at::Tensor*, const char*>
      selections[] = {{Similarity::Dot, SelectScores::Ieee, &queries, &keys, &mask, ""},
                      {Similarity::L1, SelectScores::Ieee, &queries, &keys, &mask, ""},
                      {Similarity::Dot, SelectScores::TensorCores, &wide_queries, &wide_tied_keys, &mask,
                       ", tensor cores"},
                      {Similarity::Dot, SelectScores::TensorCores, &wide_queries, &wide_tied_keys, &no_mask,
                       ", tensor cores, no mask"}};
  for (const auto& [similarity, scores_by, rows, candidates, call_mask, by] : selections) {
    const auto [scores, indices] = select_forward(*rows, *candidates, 6, similarity, *call_mask, false, run, scores_by);
    const auto [want_scores, want_indices] =
        generic::knn_select(*rows, *candidates, 6, to_string(similarity),
                            call_mask->defined() ? c10::optional<at::Tensor>(*call_mask) : c10::nullopt, false);
    if (!at::equal(indices, want_indices) ||
        !at::allclose(scores.to(at::kFloat), want_scores.to(at::kFloat), score_tolerance, 0.0)) {
      return std::string("knn_select (") + to_string(similarity) + by + ")";
    }
  }
  // The backward on a third of the keys: a dot product (the aggregation kernels), cosine (the
  // pair-gradient kernels' linear terms) and chebyshev (their sign term on one feature).
  const auto few_keys = keys.narrow(1, 0, 24).contiguous();
  const auto few_mask = mask.narrow(1, 0, 24).contiguous();
  for (const auto similarity : {Similarity::ScaledDot, Similarity::Cosine, Similarity::Chebyshev}) {
    const auto [scores, indices] =
        generic::knn_select(queries, few_keys, 6, to_string(similarity), few_mask, false);
    const auto grad_scores = at::randn(scores.sizes(), generator).to(on_device);
    const auto fused = select_backward(grad_scores, queries, few_keys, indices, scores, similarity, run);
    const auto expected =
        generic::knn_select_backward(grad_scores, queries, few_keys, indices, scores, to_string(similarity));
    if (!close(std::get<0>(fused), std::get<0>(expected), tolerance) ||
        !close(std::get<1>(fused), std::get<1>(expected), tolerance)) {
      return std::string("knn_select_backward (") + to_string(similarity) + ")";
    }
  }
  return std::nullopt;
}

// The fused knn_attention on integer-valued features (D = 4: every score exact): the generic path's
// indices, the rest to rounding, with softmax, a bool mask, index order and a bias.
std::optional<std::string> attention_check(const c10::Device& device, at::ScalarType dtype, double tolerance,
                                           const LaunchRunner& run) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(2);
  const auto on_device = at::TensorOptions().device(device).dtype(dtype);
  const auto queries = at::randint(-3, 4, {2, 9, 4}, generator).to(on_device);
  const auto keys = at::randint(-3, 4, {2, 70, 4}, generator).to(on_device);
  const auto values = at::randn({2, 70, 5}, generator).to(on_device);
  const auto kernel = at::randn({5, 6}, generator).to(on_device), bias = at::randn({5}, generator).to(on_device);
  const auto mask = (at::rand({9, 70}, generator) > 0.3).to(device);
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> want;  // the last similarity's (l1), for the backward
  for (const auto similarity : {Similarity::ScaledDot, Similarity::L1}) {
    const auto fused =
        attention_forward(queries, keys, values, kernel, bias, 6, similarity, mask, true, Rho::Softmax, 0.5, run);
    want = generic::knn_attention(queries, keys, values, kernel, bias, 6, to_string(similarity), mask, true, "softmax",
                                  0.5);
    if (!at::equal(std::get<2>(fused), std::get<2>(want)) || !close(std::get<0>(fused), std::get<0>(want), tolerance) ||
        !close(std::get<1>(fused), std::get<1>(want), tolerance) ||
        !close(std::get<3>(fused), std::get<3>(want), tolerance)) {
      return std::string("knn_attention (") + to_string(similarity) + ")";
    }
  }
  const auto& [output, scores, indices, weights] = want;
  // The composed forward's rho and aggregation, on the generic select's scores and indices.
  const auto [rho_output, rho_weights] = rho_aggregate(scores, indices, values, kernel, bias, Rho::Softmax, 0.5, run);
  if (!close(rho_output, output, tolerance) || !close(rho_weights, weights, tolerance)) {
    return std::string("knn_attention (rho and aggregation)");
  }
  // The backward's fused step, through the generic select backward: the generic backward's query gradient.
  const auto grad_output = at::randn(output.sizes(), generator).to(on_device);
  const auto grad_scores = softmax_scores_gradient(grad_output, values, weights, indices, kernel, 0.5, run);
  const auto fused = std::get<0>(generic::knn_select_backward(grad_scores, queries, keys, indices, scores, "l1"));
  const auto expected = std::get<0>(generic::knn_attention_backward(grad_output, queries, keys, values, kernel, scores,
                                                                    indices, weights, "l1", "softmax", 0.5,
                                                                    {true, false, false, false, false}));
  if (!close(fused, expected, tolerance)) return std::string("knn_attention_backward (softmax scores gradient)");
  // The two-kernel backward on the scaled_dot forward: all five gradients.
  const auto [dot_output, dot_scores, dot_indices, dot_weights] = generic::knn_attention(
      queries, keys, values, kernel, bias, 6, "scaled_dot", mask, true, "softmax", 0.5);
  const auto two_kernels = attention_backward(grad_output, queries, keys, values, kernel, dot_scores, dot_indices,
                                              dot_weights, Similarity::ScaledDot, 0.5, run);
  const auto composed = generic::knn_attention_backward(grad_output, queries, keys, values, kernel, dot_scores,
                                                        dot_indices, dot_weights, "scaled_dot", "softmax", 0.5,
                                                        {true, true, true, true, true});
  const std::array<at::Tensor, 5> want_gradients{std::get<0>(composed), std::get<1>(composed), std::get<2>(composed),
                                                 std::get<3>(composed), std::get<4>(composed)};
  const char* const names[] = {"queries", "keys", "values", "kernel", "bias"};
  for (size_t i = 0; i < want_gradients.size(); ++i) {
    if (!close(two_kernels[i], want_gradients[i], tolerance)) {
      return std::string("knn_attention_backward (two kernels, d ") + names[i] + ")";
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> first_call_check(const c10::Device& device, at::ScalarType dtype, const LaunchRunner& run) {
  const double tolerance = dtype == at::kFloat ? 1e-4 : 5e-2;
  if (auto failure = aggregate_check(device, dtype, tolerance, run)) return failure;
  // The select backward runs on the aggregation.
  if (auto failure = select_check(device, dtype, tolerance, run)) return failure;
  return attention_check(device, dtype, tolerance, run);
}

}  // namespace convnn::ops::cuda::triton
