// Float64 finite-difference checks of every differentiable input of the two core ops. Selection is
// piecewise constant, so the inputs are drawn until every row's candidate ranking has clear gaps
// (and, for chebyshev, every pair has a unique largest coordinate difference): a perturbation of
// 1e-6 then never changes which candidates are selected or in which slot they sit.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <limits>
#include <ostream>
#include <string>

#include "convnn/nn/functional/convnn.h"
#include "convnn/ops/knn_ops.h"
#include "ops/reference/reference.h"
#include "support/enum_lists.h"
#include "support/gradcheck.h"

namespace {

using convnn::Similarity;
using convnn::testing::GradCheck;

constexpr double kMinGap = 1e-3;  // far above the 1e-6 finite-difference step

at::Tensor randn(c10::IntArrayRef shape, at::Generator& generator) {
  return at::randn(shape, generator, at::TensorOptions().dtype(at::kDouble));
}

c10::optional<at::Tensor> optional(const at::Tensor& t) {
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

// Smallest gap between two distinct finite values along the last dim (inf when fewer than two).
double smallest_gap(const at::Tensor& t) {
  const auto sorted = std::get<0>(t.sort(-1));
  const auto gaps = sorted.diff(1, -1);
  const auto finite = at::isfinite(gaps);
  if (!finite.any().item<bool>()) return std::numeric_limits<double>::infinity();
  return gaps.masked_select(finite).min().item<double>();
}

bool well_separated(const at::Tensor& q, const at::Tensor& k, Similarity s,
                    const at::Tensor& mask) {
  const auto keys = convnn::reference::ranking_keys(q, k, s, optional(mask));
  if (smallest_gap(keys) < kMinGap) return false;
  const auto distances = (q.unsqueeze(2) - k.unsqueeze(1)).abs();  // [G,N,M,D]
  // l1's gradient is sign(q - k): no coordinate difference may be near 0, where the sign flips.
  if (s == Similarity::L1) return distances.min().item<double>() >= kMinGap;
  if (s != Similarity::Chebyshev) return true;
  const auto top2 = std::get<0>(distances.topk(2, -1));
  return (top2.select(-1, 0) - top2.select(-1, 1)).min().item<double>() >= kMinGap;
}

struct SelectInputs {
  at::Tensor queries, keys;
};

// Draws queries [G,N,D] and keys [G,M,D] until the selection is stable under small perturbations.
SelectInputs separated_inputs(Similarity s, const at::Tensor& mask = {}, int64_t g = 2,
                              int64_t n = 3, int64_t m = 5, int64_t d = 3) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(s) + 1);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    auto q = randn({g, n, d}, generator), k = randn({g, m, d}, generator);
    if (well_separated(q, k, s, mask)) return {q.requires_grad_(), k.requires_grad_()};
  }
  ADD_FAILURE() << "no well-separated inputs found";
  return {};
}

// knn_select's scores with the masked (-inf) slots replaced by 0 so that they can be summed.
at::Tensor select_scores(const at::Tensor& q, const at::Tensor& k, int64_t top, Similarity s,
                         const at::Tensor& mask, bool index_order) {
  const auto scores = std::get<0>(
      convnn::ops::knn_select(q, k, top, convnn::to_string(s), optional(mask), index_order));
  return at::where(at::isneginf(scores), at::zeros_like(scores), scores);
}

struct SelectCase {
  Similarity similarity;
  bool index_order;
};

void PrintTo(const SelectCase& c, std::ostream* os) {
  *os << convnn::to_string(c.similarity) << (c.index_order ? ", index order" : ", score order");
}

class SelectGradients : public ::testing::TestWithParam<SelectCase> {
 protected:
  ::testing::AssertionResult CheckQueriesAndKeys(const at::Tensor& mask, int64_t top = 3) {
    const auto s = GetParam().similarity;
    const bool index_order = GetParam().index_order;
    const auto in = separated_inputs(s, mask);
    return GradCheck(
        [&](const std::vector<at::Tensor>& x) {
          return select_scores(x[0], x[1], top, s, mask, index_order);
        },
        {in.queries, in.keys});
  }
};

TEST_P(SelectGradients, QueriesAndKeysWithoutMask) { EXPECT_TRUE(CheckQueriesAndKeys({})); }

TEST_P(SelectGradients, QueriesAndKeysWhenKEqualsM) { EXPECT_TRUE(CheckQueriesAndKeys({}, 5)); }

TEST_P(SelectGradients, QueriesAndKeysWithBoolMaskOfShapeNM) {
  // Every row keeps at least 3 valid candidates.
  const auto mask = at::tensor({1, 0, 1, 1, 0,  //
                                0, 1, 1, 1, 1,  //
                                1, 1, 1, 0, 0},
                               at::kLong)
                        .to(at::kBool)
                        .view({3, 5});
  EXPECT_TRUE(CheckQueriesAndKeys(mask));
}

TEST_P(SelectGradients, QueriesAndKeysWithAdditiveMaskOfShapeGNMAndShortRows) {
  // Rows with 0, 1 and 2 valid candidates for k = 3: their -inf slots must pass no gradient.
  const double inf = std::numeric_limits<double>::infinity();
  auto mask = at::zeros({2, 3, 5}, at::kDouble);
  mask[0][0].fill_(-inf);
  mask[0][1].narrow(0, 1, 4).fill_(-inf);
  mask[1][2].narrow(0, 0, 3).fill_(-inf);
  EXPECT_TRUE(CheckQueriesAndKeys(mask));
}

TEST_P(SelectGradients, NonContiguousQueriesAndKeys) {
  const auto s = GetParam().similarity;
  const bool index_order = GetParam().index_order;
  const auto in = separated_inputs(s);
  // Same values, transposed memory layout.
  const auto q = in.queries.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_();
  const auto k = in.keys.detach().transpose(0, 2).contiguous().transpose(0, 2).requires_grad_();
  ASSERT_FALSE(q.is_contiguous());
  ASSERT_FALSE(k.is_contiguous());
  EXPECT_TRUE(GradCheck(
      [&](const std::vector<at::Tensor>& x) {
        return select_scores(x[0], x[1], 3, s, {}, index_order);
      },
      {q, k}));
}

TEST_P(SelectGradients, NonContiguousUpstreamGradient) {
  const auto s = GetParam().similarity;
  const bool index_order = GetParam().index_order;
  const auto in = separated_inputs(s);
  // The backward of transpose and of a sum over a dim hand knn_select strided / expanded grads.
  for (const auto& tail : std::vector<std::function<at::Tensor(const at::Tensor&)>>{
           [](const at::Tensor& y) { return y.transpose(0, 2); },
           [](const at::Tensor& y) { return y.sum(1); },
           [](const at::Tensor& y) { return y.narrow(-1, 1, 2); }}) {
    EXPECT_TRUE(GradCheck(
        [&](const std::vector<at::Tensor>& x) {
          return tail(select_scores(x[0], x[1], 3, s, {}, index_order));
        },
        {in.queries, in.keys}));
  }
}

// Every similarity, in both slot orders.
std::vector<SelectCase> all_select_cases() {
  std::vector<SelectCase> cases;
  for (const auto similarity : convnn::testing::all_similarities()) {
    cases.push_back(SelectCase{similarity, false});
    cases.push_back(SelectCase{similarity, true});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(KnnSelectGradients, SelectGradients,
                         ::testing::ValuesIn(all_select_cases()),
                         [](const auto& info) {
                           return std::string(convnn::to_string(info.param.similarity)) +
                                  (info.param.index_order ? "_IndexOrder" : "_ScoreOrder");
                         });

// ------------------------------------------------------------------------------ knn_aggregate

struct AggregateInputs {
  at::Tensor values, weights, indices, kernel, bias;
};

AggregateInputs aggregate_inputs(bool depthwise, bool with_bias, bool duplicates) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
  const int64_t g = 2, m = 5, n = 3, c = 3, k = 4, c_out = 2;
  AggregateInputs in;
  in.values = randn({g, m, c}, generator).requires_grad_();
  in.weights = randn({g, n, k}, generator).requires_grad_();
  in.indices = duplicates ? at::randint(2, {g, n, k}, generator, at::kLong)
                          : at::randint(m, {g, n, k}, generator, at::kLong);
  in.kernel =
      (depthwise ? randn({c, k}, generator) : randn({c_out, c, k}, generator)).requires_grad_();
  if (with_bias) in.bias = randn({depthwise ? c : c_out}, generator).requires_grad_();
  return in;
}

::testing::AssertionResult AggregateGradCheck(
    const AggregateInputs& in, const std::function<at::Tensor(const at::Tensor&)>& tail =
                                   [](const at::Tensor& y) { return y; }) {
  std::vector<at::Tensor> inputs{in.values, in.weights, in.kernel};
  if (in.bias.defined()) inputs.push_back(in.bias);
  return GradCheck(
      [&](const std::vector<at::Tensor>& x) {
        return tail(convnn::ops::knn_aggregate(
            x[0], x[1], in.indices, x[2],
            x.size() > 3 ? c10::optional<at::Tensor>(x[3]) : c10::nullopt));
      },
      inputs);
}

struct AggregateCase {
  bool depthwise, bias;
};

void PrintTo(const AggregateCase& c, std::ostream* os) {
  *os << (c.depthwise ? "depthwise" : "standard") << (c.bias ? " with bias" : " without bias");
}

class AggregateGradients : public ::testing::TestWithParam<AggregateCase> {};

TEST_P(AggregateGradients, ValuesWeightsKernelAndBias) {
  EXPECT_TRUE(AggregateGradCheck(aggregate_inputs(GetParam().depthwise, GetParam().bias, false)));
}

TEST_P(AggregateGradients, DuplicateIndicesAccumulateIntoValues) {
  EXPECT_TRUE(AggregateGradCheck(aggregate_inputs(GetParam().depthwise, GetParam().bias, true)));
}

TEST_P(AggregateGradients, NonContiguousInputs) {
  const auto in = aggregate_inputs(GetParam().depthwise, GetParam().bias, false);
  const auto relayout = [](const at::Tensor& t) {
    if (!t.defined() || t.dim() < 2) return t;
    return t.detach().transpose(0, -1).contiguous().transpose(0, -1).requires_grad_(
        t.requires_grad());
  };
  const AggregateInputs views{relayout(in.values), relayout(in.weights), relayout(in.indices),
                              relayout(in.kernel), in.bias};
  ASSERT_FALSE(views.values.is_contiguous());
  ASSERT_FALSE(views.indices.is_contiguous());
  EXPECT_TRUE(AggregateGradCheck(views));
}

TEST_P(AggregateGradients, NonContiguousUpstreamGradient) {
  const auto in = aggregate_inputs(GetParam().depthwise, GetParam().bias, false);
  EXPECT_TRUE(AggregateGradCheck(in, [](const at::Tensor& y) { return y.transpose(1, 2); }));
  EXPECT_TRUE(AggregateGradCheck(in, [](const at::Tensor& y) { return y.sum(1); }));
  EXPECT_TRUE(AggregateGradCheck(in, [](const at::Tensor& y) { return y.narrow(1, 1, 2); }));
}

INSTANTIATE_TEST_SUITE_P(KnnAggregateGradients, AggregateGradients,
                         ::testing::Values(AggregateCase{true, false}, AggregateCase{true, true},
                                           AggregateCase{false, false}, AggregateCase{false, true}),
                         [](const auto& info) {
                           return std::string(info.param.depthwise ? "Depthwise" : "Standard") +
                                  (info.param.bias ? "WithBias" : "WithoutBias");
                         });

// ------------------------------------------------------------------------------ composition

TEST(OpChainGradients, SelectSoftmaxAggregateWithMaskThroughQueriesKeysValuesAndKernel) {
  // The chain every layer runs: knn_select -> rho (softmax, temperature) -> knn_aggregate, with a
  // causal mask that leaves the first rows short of k valid candidates.
  const auto s = Similarity::ScaledDot;
  const auto mask = convnn::nn::functional::causal_mask(4).view({1, 4, 4}).expand({2, 4, 4});
  const auto in = separated_inputs(s, mask, 2, 4, 4, 3);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(11);
  const auto values = randn({2, 4, 2}, generator).requires_grad_();
  const auto kernel = randn({3, 2, 3}, generator).requires_grad_();
  EXPECT_TRUE(GradCheck(
      [&](const std::vector<at::Tensor>& x) {
        auto [scores, indices] = convnn::ops::knn_select(x[0], x[1], 3, "scaled_dot", mask, true);
        const auto w = convnn::nn::functional::rho_weights(scores, convnn::nn::Rho::Softmax, 0.5);
        return convnn::ops::knn_aggregate(x[2], w, indices, x[3], c10::nullopt);
      },
      {in.queries, in.keys, values, kernel}));
}

TEST(OpChainGradients, RhoWeightsSoftmaxWithMaskedSlotsAndTemperature) {
  const double inf = std::numeric_limits<double>::infinity();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(12);
  auto scores = randn({2, 3, 4}, generator);
  scores[0][1][2] = -inf;
  scores[1][0].fill_(-inf);
  scores.requires_grad_();
  // uniform and mean are piecewise constant in the scores: only softmax has a gradient.
  for (const double temperature : {0.7, 2.0}) {
    EXPECT_TRUE(GradCheck(
        [&](const std::vector<at::Tensor>& x) {
          return convnn::nn::functional::rho_weights(x[0], convnn::nn::Rho::Softmax, temperature);
        },
        {scores}))
        << "temperature " << temperature;
  }
}

}  // namespace
