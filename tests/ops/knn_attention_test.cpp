// The fused convnn::knn_attention (select + rho + aggregate in one pass, src/ops/cpu/
// knn_attention_*) equals the composition knn_select -> rho -> knn_aggregate it replaces: the same
// scores and indices, the same output and gradients in float64, an error against float64 at most
// twice the plain-ATen reference's in float32, bfloat16 and float16 given the same indices, float64
// gradients that pass finite differences, and bitwise reproducible backward passes. Every sweep
// covers depthwise and standard kernels, masks, random candidates (M < N), non-contiguous inputs,
// and K = 1 and K = M.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "convnn/nn/functional/convnn.h"
#include "convnn/nn/modules/convnn.h"
#include "convnn/ops/knn_ops.h"
#include "ops/reference/reference.h"
#include "support/assert_close.h"
#include "support/gradcheck.h"

namespace knn_attention_test {  // apart from the files of its unity batch (tests/CMakeLists.txt)

namespace {

using convnn::Rho;
using convnn::Similarity;
using convnn::testing::AllClose;
using convnn::testing::epsilon_of;
using convnn::testing::max_abs_diff;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

enum class MaskKind { None, Bool, AdditivePerSlice, Causal };

struct Case {
  int64_t g, n, m, d, c, k;
  bool depthwise, bias;
  MaskKind mask;
  Similarity similarity;
  Rho rho;
  bool index_order;
  std::string name() const {
    return "G=" + std::to_string(g) + " N=" + std::to_string(n) + " M=" + std::to_string(m) +
           " C=" + std::to_string(c) + " K=" + std::to_string(k) +
           (depthwise ? " depthwise" : " standard") + (bias ? " bias" : "") + " mask=" +
           std::to_string(static_cast<int>(mask)) + " " + convnn::to_string(similarity) + " " +
           convnn::to_string(rho) + (index_order ? " index-order" : "");
  }
};

// The inputs of one case in float64. Queries and values are non-contiguous views (a transpose of
// a larger buffer), so the ops' layout handling is part of every check.
struct Inputs {
  torch::Tensor queries, keys, values, kernel, bias, mask;  // bias and mask may be undefined

  Inputs to(torch::ScalarType dtype) const {
    Inputs r = *this;
    for (auto* t : {&r.queries, &r.keys, &r.values, &r.kernel, &r.bias}) {
      if (t->defined()) *t = t->to(dtype);
    }
    if (r.mask.defined() && r.mask.scalar_type() != torch::kBool) r.mask = r.mask.to(dtype);
    return r;
  }
  c10::optional<torch::Tensor> optional_bias() const {
    return bias.defined() ? c10::optional<torch::Tensor>(bias) : c10::nullopt;
  }
  c10::optional<torch::Tensor> optional_mask() const {
    return mask.defined() ? c10::optional<torch::Tensor>(mask) : c10::nullopt;
  }
};

torch::Tensor make_mask(const Case& c) {
  switch (c.mask) {
    case MaskKind::None: return {};
    case MaskKind::Bool: return torch::rand({c.n, c.m}, torch::kDouble) > 0.3;
    case MaskKind::AdditivePerSlice: {
      auto additive = torch::zeros({c.g, c.n, c.m}, torch::kDouble);
      return additive.masked_fill(torch::rand({c.g, c.n, c.m}, torch::kDouble) < 0.3, kNegInf);
    }
    case MaskKind::Causal: return torch::ones({c.n, c.m}, torch::kBool).tril();
  }
  return {};
}

Inputs make_inputs(const Case& c, uint64_t seed) {
  torch::manual_seed(seed);
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  Inputs in;
  in.queries = torch::randn({c.g, c.d, c.n}, f64).transpose(1, 2);
  in.keys = torch::randn({c.g, c.m, c.d}, f64);
  in.values = torch::randn({c.g, c.c, c.m}, f64).transpose(1, 2);
  in.kernel = c.depthwise ? torch::randn({c.c, c.k}, f64) : torch::randn({c.c + 1, c.c, c.k}, f64);
  if (c.bias) in.bias = torch::randn({c.depthwise ? c.c : c.c + 1}, f64);
  in.mask = make_mask(c);
  return in;
}

constexpr double kTemperature = 0.7;

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> fused(const Case& c,
                                                                             const Inputs& in) {
  return convnn::ops::knn_attention(in.queries, in.keys, in.values, in.kernel, in.optional_bias(),
                                    c.k, convnn::to_string(c.similarity), in.optional_mask(),
                                    c.index_order, convnn::to_string(c.rho), kTemperature);
}

// The path knn_attention replaces: the two fused ops with rho in plain ATen between them.
torch::Tensor composed(const Case& c, const Inputs& in) {
  auto [scores, indices] = convnn::ops::knn_select(in.queries, in.keys, c.k,
                                                   convnn::to_string(c.similarity),
                                                   in.optional_mask(), c.index_order);
  const auto weights = convnn::reference::rho_weights(scores, c.rho, kTemperature);
  return convnn::ops::knn_aggregate(in.values, weights, indices, in.kernel, in.optional_bias());
}

// The reference output for fixed indices, in the inputs' dtype: scores recomputed from the
// selected pairs, masked slots at -inf, rho, and the reference aggregation.
torch::Tensor reference_given_indices(const Case& c, const Inputs& in, const torch::Tensor& indices,
                                      const torch::Tensor& masked_slots) {
  auto scores = convnn::reference::selected_scores(in.queries, in.keys, indices, c.similarity);
  scores = scores.masked_fill(masked_slots, kNegInf);
  const auto weights = convnn::reference::rho_weights(scores, c.rho, kTemperature);
  return convnn::reference::knn_aggregate(in.values, weights, indices, in.kernel,
                                          in.optional_bias());
}

std::vector<Case> sweep() {
  std::vector<Case> cases;
  const auto sims = {Similarity::Dot, Similarity::ScaledDot, Similarity::Cosine, Similarity::Gaussian};
  int variant = 0;
  for (const auto similarity : sims) {
    for (const auto rho : {Rho::Uniform, Rho::Mean, Rho::Softmax}) {
      for (const bool depthwise : {true, false}) {
        ++variant;
        const auto mask = static_cast<MaskKind>(variant % 4);
        const bool random_candidates = variant % 3 == 0;  // M < N, as the layers' r candidates
        const int64_t n = 9, m = random_candidates ? 5 : 9;
        const int64_t k = variant % 5 == 0 ? m : (variant % 5 == 1 ? 1 : 3);
        // Every third case over enough slices for the CPU backward's tasks of whole slices.
        const int64_t g = variant % 3 == 2 ? 17 : 2;
        cases.push_back({g, n, m, 4, 3, k, depthwise, variant % 2 == 0,
                         mask == MaskKind::Causal && random_candidates ? MaskKind::Bool : mask,
                         similarity, rho, variant % 4 == 1});
      }
    }
  }
  // Past one 256-row task and one 64-row select block, with a per-slice mask.
  cases.push_back({3, 300, 70, 5, 6, 9, true, true, MaskKind::AdditivePerSlice, Similarity::ScaledDot,
                   Rho::Softmax, false});
  cases.push_back({2, 270, 40, 3, 4, 8, false, false, MaskKind::Causal, Similarity::Dot, Rho::Mean, true});
  // The backward's tasks of two slices, the last one of one; and tasks of 130-row slices.
  cases.push_back({37, 9, 9, 4, 3, 3, false, true, MaskKind::Bool, Similarity::ScaledDot, Rho::Softmax, false});
  cases.push_back({20, 130, 130, 8, 8, 9, true, true, MaskKind::None, Similarity::Dot, Rho::Softmax, false});
  return cases;
}

TEST(FusedAttention, EqualsTheComposedOpsInFloat64) {
  uint64_t seed = 100;
  for (const auto& c : sweep()) {
    SCOPED_TRACE(c.name());
    const auto in = make_inputs(c, ++seed);
    auto [output, scores, indices, weights] = fused(c, in);
    auto [expected_scores, expected_indices] = convnn::ops::knn_select(
        in.queries, in.keys, c.k, convnn::to_string(c.similarity), in.optional_mask(), c.index_order);
    EXPECT_TRUE(torch::equal(indices, expected_indices));
    EXPECT_TRUE(torch::equal(scores, expected_scores));
    EXPECT_TRUE(AllClose(weights, convnn::reference::rho_weights(scores, c.rho, kTemperature), 1e-15, 1e-14));
    EXPECT_TRUE(AllClose(output, composed(c, in), 1e-13, 1e-13));
  }
}

TEST(FusedAttention, EqualsThePlainATenReference) {
  uint64_t seed = 200;
  for (const auto& c : sweep()) {
    SCOPED_TRACE(c.name());
    const auto in = make_inputs(c, ++seed);
    auto [output, scores, indices, weights] = fused(c, in);
    auto [ref_output, ref_scores, ref_indices, ref_weights] = convnn::reference::knn_attention(
        in.queries, in.keys, in.values, in.kernel, in.optional_bias(), c.k, c.similarity,
        in.optional_mask(), c.index_order, c.rho, kTemperature);
    EXPECT_TRUE(torch::equal(indices, ref_indices));
    EXPECT_TRUE(AllClose(output, ref_output, 1e-12, 1e-12));
  }
}

TEST(FusedAttention, GradientsEqualTheComposedOpsInFloat64) {
  uint64_t seed = 300;
  for (const auto& c : sweep()) {
    SCOPED_TRACE(c.name());
    auto in = make_inputs(c, ++seed);
    std::vector<torch::Tensor> leaves = {in.queries, in.keys, in.values, in.kernel};
    if (in.bias.defined()) leaves.push_back(in.bias);
    auto grads_of = [&](bool use_fused) {
      std::vector<torch::Tensor> x;
      for (const auto& t : leaves) x.push_back(t.detach().clone().requires_grad_());
      Inputs run = in;
      run.queries = x[0];
      run.keys = x[1];
      run.values = x[2];
      run.kernel = x[3];
      if (in.bias.defined()) run.bias = x[4];
      const auto out = use_fused ? std::get<0>(fused(c, run)) : composed(c, run);
      out.backward(torch::cos(torch::arange(out.numel(), torch::kDouble)).view(out.sizes()));
      std::vector<torch::Tensor> grads;
      for (const auto& t : x) grads.push_back(t.grad());
      return grads;
    };
    const auto fused_grads = grads_of(true), composed_grads = grads_of(false);
    for (size_t e = 0; e < leaves.size(); ++e) {
      ASSERT_EQ(fused_grads[e].defined(), composed_grads[e].defined()) << "input " << e;
      if (fused_grads[e].defined()) {
        EXPECT_TRUE(AllClose(fused_grads[e], composed_grads[e], 1e-12, 1e-12)) << "input " << e;
      }
    }
  }
}

// Well-separated scores, so that the finite-difference steps never change the selection.
TEST(FusedAttention, GradientsPassFiniteDifferencesInFloat64) {
  for (const bool depthwise : {true, false}) {
    for (const auto rho : {Rho::Softmax, Rho::Mean}) {
      // 17 slices: the CPU backward's tasks of whole slices.
      const int64_t g = rho == Rho::Softmax ? 17 : 2;
      const Case c{g, 6, 7, 3, 2, 3, depthwise, true, MaskKind::Causal, Similarity::ScaledDot, rho, true};
      SCOPED_TRACE(c.name());
      auto in = make_inputs(c, depthwise ? 7 : 8);
      in.queries = (in.queries * 3.0).detach().requires_grad_();
      in.keys = in.keys.detach().requires_grad_();
      in.values = in.values.detach().requires_grad_();
      in.kernel = in.kernel.detach().requires_grad_();
      in.bias = in.bias.detach().requires_grad_();
      EXPECT_TRUE(convnn::testing::GradCheck(
          [&](const std::vector<at::Tensor>& x) {
            Inputs run = in;
            run.queries = x[0];
            run.keys = x[1];
            run.values = x[2];
            run.kernel = x[3];
            run.bias = x[4];
            return std::get<0>(fused(c, run));
          },
          {in.queries, in.keys, in.values, in.kernel, in.bias}));
    }
  }
}

// The flash-attention criterion, given the indices the fused op chose: |fused - truth| <=
// 2 |reference - truth| + one ulp of the output scale, with truth in float64 from the rounded
// inputs.
TEST(FusedAttention, LowPrecisionErrorIsAtMostTwiceTheReference) {
  const std::vector<Case> cases = {
      {3, 300, 70, 16, 24, 9, true, true, MaskKind::None, Similarity::ScaledDot, Rho::Softmax, false},
      {2, 64, 64, 8, 12, 16, false, true, MaskKind::Causal, Similarity::Cosine, Rho::Softmax, true},
      {2, 50, 20, 8, 10, 20, true, false, MaskKind::Bool, Similarity::Dot, Rho::Mean, false}};
  for (const auto& c : cases) {
    const auto in64 = make_inputs(c, 400 + c.n);
    for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
      SCOPED_TRACE(c.name() + " " + c10::toString(dtype));
      const auto low = in64.to(dtype);
      auto [output, scores, indices, weights] = fused(c, low);
      const auto masked = torch::isneginf(scores);
      const auto truth = reference_given_indices(c, low.to(torch::kDouble), indices, masked);
      const auto reference = reference_given_indices(c, low, indices, masked);
      const double scale = truth.abs().max().item<double>();
      const double fused_error = max_abs_diff(output, truth);
      const double reference_error = max_abs_diff(reference, truth);
      EXPECT_LE(fused_error, 2.0 * reference_error + epsilon_of(dtype) * scale)
          << "fused error " << fused_error << ", reference error " << reference_error;
    }
  }
}

TEST(FusedAttention, BackwardIsBitwiseReproducibleAndIndependentOfThreadCount) {
  // The composed steps (4 slices) and the tasks of whole slices (37).
  for (const int64_t g : {4, 37}) {
    const Case c{g, 300, 300, 8, 16, 9, g > 4, true, MaskKind::None, Similarity::ScaledDot, Rho::Softmax, false};
    SCOPED_TRACE(c.name());
    const auto in = make_inputs(c, 500).to(torch::kFloat);
    auto run = [&](int threads) {
      const int before = at::get_num_threads();
      at::set_num_threads(threads);
      std::vector<torch::Tensor> x = {in.queries.detach().clone().requires_grad_(),
                                      in.keys.detach().clone().requires_grad_(),
                                      in.values.detach().clone().requires_grad_(),
                                      in.kernel.detach().clone().requires_grad_()};
      Inputs r = in;
      std::tie(r.queries, r.keys, r.values, r.kernel) = std::tie(x[0], x[1], x[2], x[3]);
      r.bias = torch::Tensor();
      const auto out = std::get<0>(fused(c, r));
      out.backward(torch::ones_like(out));
      at::set_num_threads(before);
      std::vector<torch::Tensor> results = {out.detach()};
      for (const auto& t : x) results.push_back(t.grad());
      return results;
    };
    const auto first = run(2), second = run(2), single = run(1);
    for (size_t e = 0; e < first.size(); ++e) {
      EXPECT_TRUE(torch::equal(first[e], second[e])) << "tensor " << e << ", two runs";
      EXPECT_TRUE(convnn::testing::SameAcrossThreadCounts(single[e], first[e]))
          << "tensor " << e << ", one against two threads";
    }
  }
}

// knn_attention_backward returns exactly the gradients asked for, each the same as the call that
// asks for all five: the composed steps (2 slices) and the tasks of whole slices (17) alike.
TEST(FusedAttention, BackwardAnswersEveryOutputMaskWithTheFullCallsGradients) {
  for (const int64_t g : {2, 17}) {
    for (const auto rho : {Rho::Softmax, Rho::Uniform}) {
      for (const bool depthwise : {true, false}) {
        const Case c{g, 9, 9, 4, 3, 3, depthwise, true, MaskKind::None, Similarity::Dot, rho, false};
        SCOPED_TRACE(c.name());
        const auto in = make_inputs(c, 700);
        // Named variables, not a structured binding: C++17 lambdas cannot capture those (Clang refuses).
        torch::Tensor output, scores, indices, weights;
        std::tie(output, scores, indices, weights) = fused(c, in);
        const auto grad_output = torch::randn_like(output);
        const auto backward = [&](std::array<bool, 5> wanted) {
          const auto [dq, dk, dv, dw, db] = convnn::ops::knn_attention_backward(
              grad_output, in.queries, in.keys, in.values, in.kernel, scores, indices, weights,
              convnn::to_string(c.similarity), convnn::to_string(c.rho), kTemperature, wanted);
          return std::vector<torch::Tensor>{dq, dk, dv, dw, db};
        };
        const auto all = backward({true, true, true, true, true});
        const bool score_gradient = rho == Rho::Softmax;
        for (int bits = 0; bits < 32; ++bits) {
          std::array<bool, 5> wanted{};
          for (int e = 0; e < 5; ++e) wanted[e] = (bits >> e & 1) != 0;
          const auto some = backward(wanted);
          for (int e = 0; e < 5; ++e) {
            SCOPED_TRACE("mask " + std::to_string(bits) + ", gradient " + std::to_string(e));
            const bool expected = wanted[e] && (e >= 2 || score_gradient);
            ASSERT_EQ(some[e].defined(), expected);
            if (expected) EXPECT_TRUE(torch::equal(some[e], all[e]));
          }
        }
      }
    }
  }
}

TEST(FusedAttention, UniformAndMeanRhoGiveNoQueryOrKeyGradient) {
  const Case c{2, 5, 5, 3, 2, 2, true, false, MaskKind::None, Similarity::Dot, Rho::Mean, false};
  auto in = make_inputs(c, 600);
  in.queries = in.queries.detach().requires_grad_();
  in.values = in.values.detach().requires_grad_();
  std::get<0>(fused(c, in)).sum().backward();
  EXPECT_FALSE(in.queries.grad().defined());
  EXPECT_TRUE(in.values.grad().defined());
}

TEST(FusedAttention, RowsWithoutAValidCandidateWeighZero) {
  Case c{1, 4, 4, 3, 2, 2, true, false, MaskKind::None, Similarity::Dot, Rho::Softmax, false};
  auto in = make_inputs(c, 700);
  in.mask = torch::ones({4, 4}, torch::kBool);
  in.mask[2].fill_(false);
  auto [output, scores, indices, weights] = fused(c, in);
  EXPECT_TRUE(torch::equal(weights[0][2], torch::zeros({2}, torch::kDouble)));
  EXPECT_TRUE(torch::equal(output[0][2], torch::zeros({2}, torch::kDouble)));
  EXPECT_TRUE(AllClose(output, composed(c, in), 1e-15, 1e-14));
}

TEST(Rho, NanScoresGiveNanWeightsByThemselvesExactlyWhereTheRuleSaysSo) {
  // The composed forward fills an unrankable row's weights only where rho does not make them NaN
  // itself (knn_attention_composed.cpp): a rho whose rule is wrong would leave that row's output finite.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto scores = torch::tensor({nan, nan, nan, 0.5, kNegInf, -2.0}, torch::kDouble).view({2, 3}).to(dtype);
    for (const auto rho : {Rho::Uniform, Rho::Mean, Rho::Softmax}) {
      const auto weights = convnn::reference::rho_weights(scores, rho, kTemperature);
      EXPECT_EQ(weights[0].isnan().all().item<bool>(), convnn::reference::nan_scores_give_nan_weights(rho))
          << convnn::to_string(rho) << " " << dtype;
      EXPECT_FALSE(weights[1].isnan().any().item<bool>()) << convnn::to_string(rho) << " " << dtype;
    }
  }
}

TEST(FusedAttention, RejectsBadInputNamingTheArgument) {
  const auto q = torch::randn({2, 5, 3});
  const auto v = torch::randn({2, 5, 4});
  const auto kernel = torch::ones({4, 2});
  auto call = [&](const torch::Tensor& values, const torch::Tensor& ker, int64_t k,
                  const std::string& rho, double temperature) {
    return convnn::ops::knn_attention(q, q, values, ker, c10::nullopt, k, "dot", c10::nullopt,
                                      false, rho, temperature);
  };
  auto message_of = [](auto&& run) -> std::string {
    try {
      run();
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    }
    return "no error";
  };
  EXPECT_NE(message_of([&] { call(v, kernel, 2, "max", 1.0); })
                .find("knn_attention: rho must be one of uniform, mean, softmax; got 'max'"),
            std::string::npos);
  EXPECT_NE(message_of([&] { call(v, kernel, 2, "softmax", 0.0); })
                .find("knn_attention: temperature must be finite and at least 1.17549e-38 (the smallest normal float32, in which softmax accumulates), got 0"),
            std::string::npos);
  EXPECT_NE(message_of([&] { call(torch::randn({2, 6, 4}), kernel, 2, "softmax", 1.0); })
                .find("keys and values must have the same G and M"),
            std::string::npos);
  EXPECT_NE(message_of([&] { call(v, kernel, 3, "softmax", 1.0); })
                .find("knn_attention: kernel shape [4, 2] does not match C = 4 (values.size(2)) and K = 3 (k)"),
            std::string::npos);
  EXPECT_NE(message_of([&] { call(v, kernel, 6, "softmax", 1.0); })
                .find("knn_attention: k must be in [1, M] where M = 5"),
            std::string::npos);
  auto nan_queries = q.clone();
  nan_queries[1][3][0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(message_of([&] {
              convnn::ops::knn_attention(nan_queries, q, v, kernel, c10::nullopt, 2, "dot",
                                         c10::nullopt, false, "softmax", 1.0);
            }).find("knn_attention: queries must be finite (NaN and +-inf cannot be ranked), found nan at position [1, 3, 0]"),
            std::string::npos);
}

TEST(FusedAttention, AutocastRunsInTheAutocastDtype) {
  const auto q = torch::randn({2, 6, 4});
  const auto kernel = torch::ones({4, 3});
  at::autocast::set_autocast_enabled(at::kCPU, true);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  const auto out = std::get<0>(convnn::ops::knn_attention(q, q, q, kernel, c10::nullopt, 3,
                                                          "scaled_dot", c10::nullopt, false,
                                                          "softmax", 1.0));
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
}

// The module's default fused path and its composed path are the same function.
TEST(FusedAttention, ConvNNAttentionFusedDefaultEqualsComposedPath) {
  using convnn::nn::ConvNNAttention;
  using convnn::nn::ConvNNAttentionOptions;
  for (const int64_t candidates : {0, 7}) {
    SCOPED_TRACE("num_candidates " + std::to_string(candidates));
    auto options = ConvNNAttentionOptions(8, 2, 4).causal(candidates == 0).num_candidates(candidates).seed(3);
    ASSERT_TRUE(options.fused());
    ConvNNAttention fused_module(options);
    ConvNNAttention composed_module(options.fused(false));
    fused_module->to(torch::kDouble);
    composed_module->to(torch::kDouble);
    torch::NoGradGuard no_grad;
    for (auto& p : composed_module->named_parameters()) p.value().copy_(fused_module->named_parameters()[p.key()]);
    const auto x = torch::randn({3, 12, 8}, torch::kDouble);
    EXPECT_TRUE(AllClose(fused_module(x), composed_module(x), 1e-13, 1e-13));
  }
}

}  // namespace

}  // namespace knn_attention_test
