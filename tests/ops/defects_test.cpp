// Defects that bad input found in the ops, each pinned by a test that failed before its fix:
// a tiny softmax temperature made NaN weights, double backward was silently zero, and a non-finite
// query or key could pass as "masked".
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

namespace {

using convnn::Rho;
using convnn::testing::AllClose;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "no error";
}

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

// torch.autograd.grad(..., create_graph=True) then a second backward: each op raises, naming
// itself, where it once returned zeros with only a warning.
void expect_double_backward_refused(const std::string& op, const std::function<at::Tensor(const at::Tensor&)>& f,
                                    const at::Tensor& input) {
  auto x = input.clone().requires_grad_();
  const auto y = f(x);
  const auto first = torch::autograd::grad({y.pow(2).sum()}, {x}, {}, /*retain_graph=*/true,
                                           /*create_graph=*/true)[0];
  EXPECT_TRUE(first.requires_grad()) << op;
  EXPECT_TRUE(AllClose(first.detach(), torch::autograd::grad({y.pow(2).sum()}, {x})[0], 1e-12)) << op;
  const auto message = error_of([&] { first.sum().backward(); });
  EXPECT_NE(message.find(op + " does not support double backward"), std::string::npos) << message;
}

TEST(DoubleBackward, EveryOpRaisesInsteadOfReturningZeros) {
  const auto in = attention_inputs(at::kDouble);
  expect_double_backward_refused(
      "knn_select",
      [&](const at::Tensor& q) {
        return std::get<0>(convnn::ops::knn_select(q, in.k, 3, "dot", c10::nullopt, false));
      },
      in.q);
  auto [scores, indices] = convnn::ops::knn_select(in.q, in.k, 5, "dot", c10::nullopt, false);
  expect_double_backward_refused(
      "knn_aggregate",
      [&](const at::Tensor& v) {
        return convnn::ops::knn_aggregate(v, scores.softmax(-1), indices, in.kernel, c10::nullopt);
      },
      in.v);
  expect_double_backward_refused(
      "knn_attention",
      [&](const at::Tensor& q) {
        return std::get<0>(convnn::ops::knn_attention(q, in.k, in.v, in.kernel, c10::nullopt, 5, "dot",
                                                      c10::nullopt, false, "softmax", 1.0));
      },
      in.q);
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
