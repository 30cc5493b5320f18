// The hook through which a device's fused knn_attention kernel serves knn_attention
// (convnn::knn_attention_device_fused, src/ops/composite/knn_attention_composed.cpp): the device's
// knn_attention asks it first and composes the core ops when it answers with no tensors. Proved here
// with a kernel of this test binary's own under the CPU key, which no library code asks (the CPU
// knn_attention has its fused C++ kernel); on CUDA the Triton kernel answers the same way.
#include <gtest/gtest.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "convnn/ops/rho.h"
#include "ops/composite/knn_attention_backward.h"
#include "ops/composite/knn_attention_composed.h"
#include "ops/generic/generic.h"
#include "ops/op_signatures.h"

namespace {

// No tensors for K = 1 (the inputs it "does not take"), three for K = 2 (a broken kernel), else
// recognisable outputs of knn_attention's shapes.
std::vector<at::Tensor> test_kernel(const convnn::checks::AttentionChecked&, const at::Tensor& queries,
                                    const at::Tensor&, const at::Tensor& values,
                                    const at::Tensor&, const c10::optional<at::Tensor>&, int64_t k,
                                    c10::string_view, const c10::optional<at::Tensor>&, bool, c10::string_view,
                                    double) {
  if (k == 1) return {};
  const int64_t g = queries.size(0), n = queries.size(1);
  auto slots = at::full({g, n, k}, 7.0, queries.options());
  if (k == 2) return {slots, slots, slots};
  return {at::full({g, n, values.size(2)}, 42.0, values.options()), slots,
          at::zeros({g, n, k}, queries.options().dtype(at::kLong)), slots};
}

// The whole backward, the same way by K: nothing for K = 1, four tensors for K = 2, else five
// gradients filled with their position (1 to 5), so that the tests can tell them apart.
int backward_calls = 0;

std::vector<at::Tensor> test_backward_kernel(const convnn::checks::AttentionChecked&, const at::Tensor&,
                                             const at::Tensor& queries, const at::Tensor& keys,
                                             const at::Tensor& values, const at::Tensor& kernel, const at::Tensor&,
                                             const at::Tensor& indices, const at::Tensor&, c10::string_view,
                                             c10::string_view, double) {
  ++backward_calls;
  const int64_t k = indices.size(2);
  if (k == 1) return {};
  std::vector<at::Tensor> gradients{at::full_like(queries, 1.0), at::full_like(keys, 2.0), at::full_like(values, 3.0),
                                    at::full_like(kernel, 4.0), at::full({kernel.size(0)}, 5.0, kernel.options())};
  if (k == 2) gradients.pop_back();
  return gradients;
}

// Rho and the aggregation after the select: nothing unless a test turns it on (other tests of this
// binary compose on CPU tensors), then recognisable outputs (the output 42, the weights 9).
bool rho_aggregate_answers = false;
int rho_aggregate_calls = 0;

std::vector<at::Tensor> test_rho_aggregate_kernel(const convnn::Rho&, const at::Tensor& scores, const at::Tensor&,
                                                  const at::Tensor& values, const at::Tensor&,
                                                  const c10::optional<at::Tensor>&, c10::string_view, double) {
  ++rho_aggregate_calls;
  if (!rho_aggregate_answers) return {};
  return {at::full({scores.size(0), scores.size(1), values.size(2)}, 42.0, values.options()),
          at::full_like(scores, 9.0)};
}

// Registered as a device registers its fused kernels: behind the op's check (src/ops/op_signatures.h).
TORCH_LIBRARY_IMPL(convnn, CPU, m) {
  namespace op = convnn::ops::op;
  op::implement_checked<op::KnnAttentionDeviceFused, &test_kernel>(m);
  op::implement_checked<op::KnnAttentionRhoAggregateDeviceFused, &test_rho_aggregate_kernel>(m);
  op::implement_checked<op::KnnAttentionBackwardDeviceFused, &test_backward_kernel>(m);
}

struct Operands {
  torch::Tensor queries = torch::randn({2, 5, 3}), keys = torch::randn({2, 8, 3}), values = torch::randn({2, 8, 4});
  torch::Tensor kernel(int64_t k) const { return torch::randn({4, k}); }
};

TEST(DeviceFusedAttention, TheDevicesKernelAnswersWhereItTakesTheInputs) {
  const Operands in;
  const auto fused = convnn::ops::composite::device_fused_attention(c10::DispatchKey::CPU, in.queries, in.keys, in.values,
                                                               in.kernel(3), c10::nullopt, 3, "dot", c10::nullopt,
                                                               false, "softmax", 1.0);
  ASSERT_TRUE(fused.has_value());
  EXPECT_TRUE(torch::equal(std::get<0>(*fused), torch::full({2, 5, 4}, 42.0)));
}

TEST(DeviceFusedAttention, NoTensorsMeansCompose) {
  const Operands in;
  EXPECT_FALSE(convnn::ops::composite::device_fused_attention(c10::DispatchKey::CPU, in.queries, in.keys, in.values,
                                                         in.kernel(1), c10::nullopt, 1, "dot", c10::nullopt, false,
                                                         "softmax", 1.0)
                   .has_value());
}

TEST(DeviceFusedAttention, AKeyWithoutAFusedKernelIsNotAsked) {
  const Operands in;
  EXPECT_FALSE(convnn::ops::composite::device_fused_attention(c10::DispatchKey::XPU, in.queries, in.keys, in.values,
                                                         in.kernel(3), c10::nullopt, 3, "dot", c10::nullopt, false,
                                                         "softmax", 1.0)
                   .has_value());
}

TEST(DeviceFusedAttention, AKernelReturningAnotherNumberOfTensorsIsAnError) {
  const Operands in;
  try {
    convnn::ops::composite::device_fused_attention(c10::DispatchKey::CPU, in.queries, in.keys, in.values, in.kernel(2),
                                              c10::nullopt, 2, "dot", c10::nullopt, false, "softmax", 1.0);
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("returned 3 tensors, not the 4 of knn_attention"), std::string::npos)
        << error.what();
  }
}

TEST(DeviceFusedAttention, TheDevicesKernelChecksTheInputsByKnnAttentionsRulesBeforeItsBody) {
  const Operands in;
  try {
    convnn::ops::composite::device_fused_attention(c10::DispatchKey::CPU, in.queries, in.keys, in.values, in.kernel(3),
                                              c10::nullopt, 3, "no such similarity", c10::nullopt, false, "softmax",
                                              1.0);
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("knn_attention: similarity"), std::string::npos) << error.what();
  }
}

// The composition asks the device's rho and aggregation kernel after the select: where it answers, its
// output and weights with the select's scores and indices; where it answers nothing, rho and
// knn_aggregate (the generic knn_attention's results); bad inputs refused by the op's check, naming them.
TEST(DeviceFusedAttention, TheCompositionAsksTheDevicesRhoAndAggregationKernelAfterTheSelect) {
  // Integer-valued features: every score exact on both paths (the CPU select's and the generic one's
  // products may round differently), ties broken by the index rule on both.
  const auto queries = torch::randint(-3, 4, {2, 5, 3}).to(torch::kFloat);
  const auto keys = torch::randint(-3, 4, {2, 8, 3}).to(torch::kFloat);
  const Operands in;
  const auto kernel = in.kernel(3);
  const auto compose = [&] {
    return convnn::ops::composite::composed_attention(queries, keys, in.values, kernel, c10::nullopt, 3, "dot",
                                                      c10::nullopt, false, "softmax", 1.0);
  };
  const auto want = convnn::ops::generic::knn_attention(queries, keys, in.values, kernel, c10::nullopt, 3, "dot",
                                                        c10::nullopt, false, "softmax", 1.0);
  struct Answering {
    Answering() { rho_aggregate_answers = true; }
    ~Answering() { rho_aggregate_answers = false; }
  };
  {
    const Answering answering;
    rho_aggregate_calls = 0;
    const auto [output, scores, indices, weights] = compose();
    EXPECT_EQ(rho_aggregate_calls, 1);
    EXPECT_TRUE(torch::equal(output, torch::full({2, 5, 4}, 42.0)));
    EXPECT_TRUE(torch::equal(weights, torch::full({2, 5, 3}, 9.0)));
    EXPECT_TRUE(torch::equal(indices, std::get<2>(want)));
    EXPECT_TRUE(torch::equal(scores, std::get<1>(want)));
  }
  rho_aggregate_calls = 0;
  const auto [output, scores, indices, weights] = compose();
  EXPECT_EQ(rho_aggregate_calls, 1) << "asked, and it answered nothing";
  EXPECT_TRUE(torch::allclose(output, std::get<0>(want), 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(weights, std::get<3>(want), 1e-6, 1e-6));
  const auto& fused = convnn::ops::op::handle<convnn::ops::op::KnnAttentionRhoAggregateDeviceFused>();
  try {
    fused.call(scores.narrow(1, 0, 4), indices, in.values, kernel, c10::nullopt, "softmax", 1.0);
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("knn_attention_rho_aggregate_device_fused: scores and indices must have "
                                             "the same shape"),
              std::string::npos)
        << error.what();
  }
}

// The composite backward with a device's fused softmax scores gradient: it is asked for softmax rho,
// and then the aggregation's backward is not asked for d(weights); where it answers an undefined
// tensor, the aggregation's weights gradient and the softmax-rho backward run as before. Either way
// the gradients are the generic backward's.
namespace composite = convnn::ops::composite;
namespace generic = convnn::ops::generic;

bool weights_gradient_asked = false;
int fused_calls = 0;
bool fused_answers = true;

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> recording_aggregate_backward(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
    const at::Tensor& kernel, std::array<bool, 4> output_mask) {
  weights_gradient_asked = output_mask[1];
  return generic::knn_aggregate_backward(grad_output, values, weights, indices, kernel, output_mask);
}

at::Tensor fused_scores_gradient(const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
                                 const at::Tensor& indices, const at::Tensor& kernel, double temperature) {
  ++fused_calls;
  if (!fused_answers) return {};
  const auto grad_weights =
      std::get<1>(generic::knn_aggregate_backward(grad_output, values, weights, indices, kernel,
                                                  {false, true, false, false}));
  return generic::softmax_rho_backward(weights, grad_weights, temperature);
}

TEST(DeviceFusedAttention, TheCompositeBackwardUsesAFusedSoftmaxScoresGradientInsteadOfTheWeightsGradient) {
  torch::manual_seed(5);
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  const auto queries = torch::randn({2, 5, 3}, opts), keys = torch::randn({2, 8, 3}, opts);
  const auto values = torch::randn({2, 8, 4}, opts), kernel = torch::randn({4, 3}, opts);
  const composite::AttentionBackwardSteps steps{&recording_aggregate_backward, &generic::softmax_rho_backward,
                                                generic::knn_select_backward, &fused_scores_gradient};
  const std::array<bool, 5> all{true, true, true, true, true};
  for (const char* rho : {"softmax", "mean"}) {
    const auto [output, scores, indices, weights] =
        generic::knn_attention(queries, keys, values, kernel, c10::nullopt, 3, "cosine", c10::nullopt, false, rho, 0.5);
    const auto grad_output = torch::randn(output.sizes(), opts);
    const auto want = generic::knn_attention_backward(grad_output, queries, keys, values, kernel, scores, indices,
                                                      weights, "cosine", rho, 0.5, all);
    const auto parsed = convnn::parse_rho(rho);
    for (const bool answers : {true, false}) {
      SCOPED_TRACE(std::string(rho) + (answers ? ", the device answers" : ", the device answers nothing"));
      fused_answers = answers;
      fused_calls = 0;
      const auto got = composite::knn_attention_backward(steps, grad_output, queries, keys, values, kernel, scores,
                                                         indices, weights, "cosine", parsed, 0.5, all);
      const bool softmax = parsed == convnn::Rho::Softmax;
      EXPECT_EQ(fused_calls, softmax ? 1 : 0) << "asked for softmax only";
      EXPECT_EQ(weights_gradient_asked, softmax && !answers);
      EXPECT_EQ(std::get<0>(got).defined(), softmax);
      if (softmax) {
        EXPECT_TRUE(torch::allclose(std::get<0>(got), std::get<0>(want), 1e-12, 1e-12));
        EXPECT_TRUE(torch::allclose(std::get<1>(got), std::get<1>(want), 1e-12, 1e-12));
      }
      EXPECT_TRUE(torch::allclose(std::get<2>(got), std::get<2>(want), 1e-12, 1e-12));
      EXPECT_TRUE(torch::allclose(std::get<3>(got), std::get<3>(want), 1e-12, 1e-12));
    }
  }
}

// The whole backward through convnn::knn_attention_backward_device_fused: asked after
// knn_attention_backward's checks, only where a query or key gradient is wanted; its gradients
// come back with the ones output_mask does not ask for undefined; no tensors mean compose.
struct BackwardOperands {
  torch::Tensor grad_output = torch::randn({2, 5, 4}), queries = torch::randn({2, 5, 3});
  torch::Tensor keys = torch::randn({2, 8, 3}), values = torch::randn({2, 8, 4});
  torch::Tensor kernel(int64_t k) const { return torch::randn({4, k}); }
  torch::Tensor slots(int64_t k) const { return torch::rand({2, 5, k}); }
  torch::Tensor indices(int64_t k) const { return torch::arange(k).repeat({2, 5, 1}); }
};

std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>> fused_backward(
    int64_t k, std::array<bool, 5> output_mask, c10::DispatchKey key = c10::DispatchKey::CPU,
    const char* similarity = "scaled_dot") {
  const BackwardOperands in;
  return convnn::ops::composite::device_fused_attention_backward(key, in.grad_output, in.queries, in.keys, in.values,
                                                            in.kernel(k), in.slots(k), in.indices(k), in.slots(k),
                                                            similarity, "softmax", 1.0, output_mask);
}

TEST(DeviceFusedAttentionBackward, TheDevicesKernelGivesTheAskedGradientsOnly) {
  const auto got = fused_backward(3, {true, false, true, false, true});
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(torch::equal(std::get<0>(*got), torch::full({2, 5, 3}, 1.0)));
  EXPECT_FALSE(std::get<1>(*got).defined());
  EXPECT_TRUE(torch::equal(std::get<2>(*got), torch::full({2, 8, 4}, 3.0)));
  EXPECT_FALSE(std::get<3>(*got).defined());
  EXPECT_TRUE(torch::equal(std::get<4>(*got), torch::full({4}, 5.0)));
}

TEST(DeviceFusedAttentionBackward, NoTensorsMeansComposeAndAnotherKeyIsNotAsked) {
  EXPECT_FALSE(fused_backward(1, {true, true, true, true, true}).has_value());
  EXPECT_FALSE(fused_backward(3, {true, true, true, true, true}, c10::DispatchKey::XPU).has_value());
}

TEST(DeviceFusedAttentionBackward, WithoutQueryOrKeyGradientsTheDeviceIsNotAsked) {
  backward_calls = 0;
  EXPECT_FALSE(fused_backward(3, {false, false, true, true, true}).has_value());
  EXPECT_EQ(backward_calls, 0);
  EXPECT_TRUE(fused_backward(3, {false, true, false, false, false}).has_value());
  EXPECT_EQ(backward_calls, 1);
}

TEST(DeviceFusedAttentionBackward, AKernelReturningAnotherNumberOfTensorsIsAnError) {
  try {
    fused_backward(2, {true, true, true, true, true});
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("returned 4 tensors, not the 5 gradients"), std::string::npos)
        << error.what();
  }
}

TEST(DeviceFusedAttentionBackward, TheDevicesKernelChecksTheInputsByKnnAttentionBackwardsRulesBeforeItsBody) {
  backward_calls = 0;
  try {
    fused_backward(3, {true, true, true, true, true}, c10::DispatchKey::CPU, "no such similarity");
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("similarity"), std::string::npos) << error.what();
  }
  EXPECT_EQ(backward_calls, 0);
}

}  // namespace
