// Defects that bad input found in the ops, each pinned by a test that failed before its fix:
// a tiny softmax temperature made NaN weights, double backward was silently zero (then refused), and a
// non-finite query or key could pass as "masked".
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "convnn/nn/functional/convnn.h"
#include "convnn/ops/knn_ops.h"
#include "ops/reference/reference.h"
#include "support/assert_close.h"
#include "support/error_message.h"

namespace defects_test {  // apart from the files of its unity batch (tests/CMakeLists.txt)

namespace {

using convnn::Rho;
using convnn::testing::AllClose;

using convnn::testing::error_of;

struct Attention {
  at::Tensor q, k, v, kernel;
};

Attention attention_inputs(at::ScalarType dtype) {
  torch::manual_seed(3);
  return {torch::randn({2, 6, 4}).to(dtype), torch::randn({2, 7, 4}).to(dtype),
          torch::randn({2, 7, 3}).to(dtype), torch::ones({3, 5}).to(dtype)};
}

// The limit of softmax(s / T) as T -> 0 is the hard max: the weight split evenly over the slots
// that hold the row's best score (in reduced precision, rounded scores may tie).
at::Tensor hard_max(const at::Tensor& scores) {
  const auto s = scores.to(at::kDouble);
  const auto best = (s == std::get<0>(s.max(-1, /*keepdim=*/true))).to(at::kDouble);
  return best / best.sum(-1, /*keepdim=*/true);
}

TEST(TinyTemperature, FusedAndComposedSoftmaxGiveTheHardMaxNotNaN) {
  for (const auto dtype : {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf}) {
    const auto in = attention_inputs(dtype);
    for (const double temperature : {double{std::numeric_limits<float>::min()}, 1e-30, 1e-12}) {
      SCOPED_TRACE(::testing::Message() << dtype << " temperature " << temperature);
      auto [output, scores, indices, weights] = convnn::ops::knn_attention(
          in.q, in.k, in.v, in.kernel, c10::nullopt, 5, "dot", c10::nullopt, false, "softmax", temperature);
      EXPECT_TRUE(at::isfinite(output).all().item<bool>());
      EXPECT_TRUE(AllClose(weights.to(at::kDouble), hard_max(scores), convnn::testing::epsilon_of(dtype)));
      const auto composed = convnn::nn::functional::rho_weights(scores, Rho::Softmax, temperature);
      EXPECT_TRUE(AllClose(composed.to(at::kDouble), hard_max(scores), convnn::testing::epsilon_of(dtype)));
    }
  }
}

TEST(TinyTemperature, SoftmaxBackwardStaysFinite) {
  const auto in = attention_inputs(at::kDouble);
  auto q = in.q.clone().requires_grad_(), k = in.k.clone().requires_grad_();
  auto out = std::get<0>(convnn::ops::knn_attention(q, k, in.v, in.kernel, c10::nullopt, 5, "dot",
                                                    c10::nullopt, false, "softmax",
                                                    double{std::numeric_limits<float>::min()}));
  out.sum().backward();
  EXPECT_TRUE(at::isfinite(q.grad()).all().item<bool>());
  EXPECT_TRUE(at::isfinite(k.grad()).all().item<bool>());
}

TEST(TinyTemperature, BelowTheSmallestNormalFloat32IsRefusedWithTheRule) {
  const auto in = attention_inputs(at::kDouble);
  for (const double temperature : {1e-40, 5e-324, 0.0}) {
    const auto message = error_of([&] {
      convnn::ops::knn_attention(in.q, in.k, in.v, in.kernel, c10::nullopt, 5, "dot", c10::nullopt, false,
                                 "softmax", temperature);
    });
    EXPECT_NE(message.find("knn_attention: temperature must be finite and at least 1.17549e-38 (the smallest "
                           "normal float32"),
              std::string::npos)
        << message;
  }
}

// A Hessian-vector product of L = sum(f(x)^2): d/dx <dL/dx, r>, the first derivative taken with
// create_graph=true.
at::Tensor hessian_vector_product(const std::function<at::Tensor(const at::Tensor&)>& f,
                                  const at::Tensor& input, const at::Tensor& direction) {
  auto x = input.clone().requires_grad_();
  const auto first = torch::autograd::grad({f(x).pow(2).sum()}, {x}, {}, /*retain_graph=*/true,
                                           /*create_graph=*/true)[0];
  return torch::autograd::grad({(first * direction).sum()}, {x})[0];
}

// Differentiating a gradient made with create_graph=true once returned zeros (PyTorch's fill for a
// disconnected graph), then raised: now each op's second derivative equals ATen autograd's through
// the reference composition, which holds the selection fixed as the op does.
void expect_second_derivative_of_reference(const std::string& op,
                                           const std::function<at::Tensor(const at::Tensor&)>& fused,
                                           const std::function<at::Tensor(const at::Tensor&)>& reference,
                                           const at::Tensor& input) {
  const auto direction = torch::randn_like(input);
  const auto expected = hessian_vector_product(reference, input, direction);
  EXPECT_GT(expected.abs().sum().item<double>(), 1e-3) << op << ": the test needs a non-zero Hessian";
  EXPECT_TRUE(AllClose(hessian_vector_product(fused, input, direction), expected, 1e-10)) << op;
}

TEST(DoubleBackward, EveryOpsSecondDerivativeEqualsTheReferenceCompositions) {
  using convnn::Similarity;
  const auto in = attention_inputs(at::kDouble);
  expect_second_derivative_of_reference(
      "knn_select",
      [&](const at::Tensor& q) {
        return std::get<0>(convnn::ops::knn_select(q, in.k, 3, "gaussian", c10::nullopt, false));
      },
      [&](const at::Tensor& q) {
        return std::get<0>(convnn::reference::knn_select(q, in.k, 3, Similarity::Gaussian, c10::nullopt, false));
      },
      in.q);
  at::Tensor scores, indices;
  std::tie(scores, indices) = convnn::ops::knn_select(in.q, in.k, 5, "dot", c10::nullopt, false);
  const auto weights = scores.softmax(-1);
  expect_second_derivative_of_reference(
      "knn_aggregate",
      [&](const at::Tensor& w) { return convnn::ops::knn_aggregate(in.v, w, indices, in.kernel, c10::nullopt); },
      [&](const at::Tensor& w) { return convnn::reference::knn_aggregate(in.v, w, indices, in.kernel, c10::nullopt); },
      weights);
  expect_second_derivative_of_reference(
      "knn_attention",
      [&](const at::Tensor& q) {
        return std::get<0>(convnn::ops::knn_attention(q, in.k, in.v, in.kernel, c10::nullopt, 5, "dot",
                                                      c10::nullopt, false, "softmax", 1.0));
      },
      [&](const at::Tensor& q) {
        return std::get<0>(convnn::reference::knn_attention(q, in.k, in.v, in.kernel, c10::nullopt, 5,
                                                            Similarity::Dot, c10::nullopt, false,
                                                            Rho::Softmax, 1.0));
      },
      in.q);
}

// The attention identity (K = N, scaled_dot, softmax, depthwise ones) holds to second order.
TEST(DoubleBackward, AttentionHessianVectorProductEqualsScaledDotProductAttentions) {
  const auto in = attention_inputs(at::kDouble);
  const auto n = in.k.size(1);
  const auto ones = torch::ones({in.v.size(2), n}, at::kDouble);
  const auto direction = torch::randn_like(in.q);
  const auto knn = hessian_vector_product(
      [&](const at::Tensor& q) {
        return std::get<0>(convnn::ops::knn_attention(q, in.k, in.v, ones, c10::nullopt, n, "scaled_dot",
                                                      c10::nullopt, false, "softmax", 1.0));
      },
      in.q, direction);
  const auto sdpa = hessian_vector_product(
      [&](const at::Tensor& q) { return at::scaled_dot_product_attention(q, in.k, in.v); }, in.q, direction);
  EXPECT_GT(sdpa.abs().sum().item<double>(), 1e-3);
  EXPECT_TRUE(AllClose(knn, sdpa, 1e-10));
}

TEST(DoubleBackward, AFirstBackwardWithoutCreateGraphBuildsNoGraph) {
  const auto in = attention_inputs(at::kDouble);
  auto q = in.q.clone().requires_grad_();
  const auto y = std::get<0>(convnn::ops::knn_attention(q, in.k, in.v, in.kernel, c10::nullopt, 5, "dot",
                                                        c10::nullopt, false, "softmax", 1.0));
  const auto grad = torch::autograd::grad({y.sum()}, {q})[0];
  EXPECT_FALSE(grad.requires_grad());
}

}  // namespace

namespace {

// The finiteness check first sums each input; a sum that overflows must not pass for a NaN.
TEST(FiniteInputs, LargeFiniteKeysWhoseSumOverflowsAreAccepted) {
  const auto keys = torch::full({1, 3, 2}, 3e38f);
  const auto queries = torch::full({1, 2, 2}, 1e-38f);
  auto [scores, indices] = convnn::ops::knn_select(queries, keys, 2, "dot", c10::nullopt, false);
  EXPECT_TRUE(AllClose(scores.to(at::kDouble), torch::full({1, 2, 2}, 6.0, at::kDouble), 1e-5, 1e-6));
  EXPECT_TRUE(at::equal(indices[0][0], torch::tensor({0, 1})));
}

}  // namespace

}  // namespace defects_test
