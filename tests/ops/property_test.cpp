// Properties that must hold on any input: checked over seeded loops of random shapes, plus the
// edge shapes (N = 1, K = 1, K = M, M != N, empty batches) and random candidates.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <random>
#include <string>

#include "convnn/nn/functional/convnn.h"
#include "convnn/nn/modules/convnn.h"
#include "convnn/ops/knn_ops.h"
#include "ops/reference/reference.h"
#include "support/assert_close.h"
#include "support/enum_lists.h"

namespace property_test {  // apart from the files of its unity batch (tests/CMakeLists.txt)
namespace {

using convnn::Similarity;
using convnn::nn::Rho;
using convnn::nn::SlotOrder;
using convnn::nn::functional::ConvNNFuncOptions;
using convnn::testing::AllClose;

constexpr double kTight = 1e-12;
const std::vector<Similarity> kSimilarities = convnn::testing::all_similarities();

// Deterministic source of random shapes and tensors.
class Random {
 public:
  explicit Random(uint64_t seed)
      : engine_(seed), generator_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}
  int64_t integer(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(engine_() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool coin() { return integer(0, 1) == 1; }
  Similarity similarity() {
    return kSimilarities[integer(0, static_cast<int64_t>(kSimilarities.size()) - 1)];
  }
  at::Tensor normal(c10::IntArrayRef shape) {
    return at::randn(shape, generator_, at::TensorOptions().dtype(at::kDouble));
  }
  at::Tensor indices(int64_t high, c10::IntArrayRef shape) {
    return at::randint(high, shape, generator_, at::TensorOptions().dtype(at::kLong));
  }

 private:
  std::mt19937_64 engine_;
  at::Generator generator_;
};

at::Generator seeded(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

// The scores knn_select reports for every pair: the similarity, or exp(-distance).
at::Tensor all_scores(const at::Tensor& q, const at::Tensor& k, Similarity s,
                      const at::Tensor& mask = {}) {
  const auto keys = convnn::reference::ranking_keys(
      q, k, s, mask.defined() ? c10::optional<at::Tensor>(mask) : c10::nullopt);
  return convnn::is_distance_similarity(s) ? at::where(at::isneginf(keys), keys, keys.exp()) : keys;
}

// Top-k of every row of `scores` [..,M], lower index first among equal scores: a 0/1 indicator.
at::Tensor top_k_indicator(const at::Tensor& scores, int64_t k) {
  const auto order = std::get<1>(at::sort(scores, c10::optional<bool>(true), -1, true));
  return at::zeros_like(scores).scatter_(-1, order.narrow(-1, 0, k), 1.0);
}

struct Shape {
  int64_t g, n, m, d, k;
};

// Selected scores really are the similarities of the selected pairs, the k of them are distinct,
// none of the unselected candidates scores higher, and the slots are in the requested order.
void ExpectTopKProperties(const Shape& shape, Similarity s, bool index_order, Random& random) {
  SCOPED_TRACE(::testing::Message() << "G=" << shape.g << " N=" << shape.n << " M=" << shape.m
                                    << " D=" << shape.d << " K=" << shape.k << " "
                                    << convnn::to_string(s) << " index_order=" << index_order);
  const auto q = random.normal({shape.g, shape.n, shape.d});
  const auto k = random.normal({shape.g, shape.m, shape.d});
  auto [scores, indices] =
      convnn::ops::knn_select(q, k, shape.k, convnn::to_string(s), c10::nullopt, index_order);
  ASSERT_EQ(scores.sizes(), (std::vector<int64_t>{shape.g, shape.n, shape.k}));
  ASSERT_EQ(indices.sizes(), scores.sizes());
  if (indices.numel() == 0) return;
  EXPECT_TRUE((indices >= 0).all().item<bool>() && (indices < shape.m).all().item<bool>());
  const auto sorted = std::get<0>(indices.sort(-1));
  EXPECT_TRUE((sorted.diff(1, -1) > 0).all().item<bool>()) << "an index repeats in a row";
  const auto every = all_scores(q, k, s);
  EXPECT_TRUE(AllClose(scores, every.gather(-1, indices), kTight, kTight));
  const auto chosen = at::zeros_like(every, at::kBool).scatter_(-1, indices, true);
  const auto lowest_chosen = at::where(chosen, every, at::full_like(every, INFINITY)).amin(-1);
  const auto best_unchosen = at::where(chosen, at::full_like(every, -INFINITY), every).amax(-1);
  // The kernel ranks by its own scores and `every` comes from ATen's GEMM: they may differ in the
  // last bits, so a near-tie may go either way; beyond rounding, no unchosen candidate is better.
  EXPECT_TRUE((lowest_chosen >= best_unchosen - kTight * (1 + best_unchosen.abs())).all().item<bool>());
  if (index_order) {
    EXPECT_TRUE(at::equal(indices, sorted));
  } else {
    EXPECT_TRUE((scores.diff(1, -1) <= 0).all().item<bool>());
  }
}

TEST(KnnSelectProperties, RandomShapesSelectTheTopKOfEveryRow) {
  Random random(1);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t m = random.integer(1, 9);
    const Shape shape{random.integer(1, 3), random.integer(1, 7), m, random.integer(1, 4),
                      random.integer(1, m)};
    ExpectTopKProperties(shape, random.similarity(), random.coin(), random);
  }
}

TEST(KnnSelectProperties, EdgeShapesNEqualsOneKEqualsOneKEqualsMAndEmptyBatch) {
  Random random(2);
  for (const auto s : kSimilarities) {
    for (const bool index_order : {false, true}) {
      ExpectTopKProperties({2, 1, 6, 3, 2}, s, index_order, random);  // N = 1
      ExpectTopKProperties({2, 5, 6, 3, 1}, s, index_order, random);  // K = 1
      ExpectTopKProperties({2, 5, 6, 3, 6}, s, index_order, random);  // K = M: a permutation
      ExpectTopKProperties({1, 4, 1, 2, 1}, s, index_order, random);  // M = 1
      ExpectTopKProperties({0, 4, 5, 3, 2}, s, index_order, random);  // G = 0
    }
  }
}

TEST(KnnSelectProperties, KEqualsOneWithDistanceSimilarityAndSelfKeysPicksEachQueryItself) {
  Random random(3);
  const auto x = random.normal({2, 7, 3});
  // Every similarity under which a point is most similar to itself: the distances and cosine (the
  // dot products prefer longer vectors).
  for (const auto similarity : kSimilarities) {
    if (!convnn::is_distance_similarity(similarity) && similarity != Similarity::Cosine) continue;
    const auto* s = convnn::to_string(similarity);
    const auto indices = std::get<1>(convnn::ops::knn_select(x, x, 1, s, c10::nullopt, false));
    EXPECT_TRUE(at::equal(indices.squeeze(-1), at::arange(7, at::kLong).expand({2, 7}))) << s;
  }
}

// ------------------------------------------------------------------------------ conv_nn

at::Tensor optional_bias(bool with_bias, int64_t c, Random& random) {
  return with_bias ? random.normal({c}) : at::Tensor();
}

TEST(ConvNNProperties, CrossKeysWithMNotEqualNEqualTheComposedOps) {
  Random random(4);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t b = random.integer(1, 2), n = random.integer(1, 6), m = random.integer(1, 8);
    const int64_t d = random.integer(1, 3), c = random.integer(1, 3), k = random.integer(1, m);
    const bool depthwise = random.coin(), index_order = random.coin();
    const auto s = random.similarity();
    const auto rho =
        std::array<Rho, 3>{Rho::Uniform, Rho::Mean, Rho::Softmax}[random.integer(0, 2)];
    const auto q = random.normal({b, n, d}), keys = random.normal({b, m, d});
    const auto values = random.normal({b, m, c});
    const auto kernel = depthwise ? random.normal({c, k}) : random.normal({c + 1, c, k});
    const auto bias = optional_bias(random.coin(), depthwise ? c : c + 1, random);
    const auto options = ConvNNFuncOptions(k).similarity(s).rho(rho).slot_order(
        index_order ? SlotOrder::Index : SlotOrder::Score);
    const auto out = convnn::nn::functional::conv_nn(q, keys, values, kernel, bias, options);
    auto [scores, indices] =
        convnn::ops::knn_select(q, keys, k, convnn::to_string(s), c10::nullopt, index_order);
    const auto expected = convnn::ops::knn_aggregate(
        values, convnn::nn::functional::rho_weights(scores, rho), indices, kernel,
        bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt);
    EXPECT_TRUE(AllClose(out, expected, kTight, kTight)) << "trial " << trial;
  }
}

// conv_nn on values that are the one-hot token ids, with a depthwise kernel of ones: output
// [b,i,c] is the total weight query i gives to token c.
at::Tensor weight_per_token(const at::Tensor& q, const at::Tensor& keys,
                            const ConvNNFuncOptions& o) {
  const int64_t b = keys.size(0), m = keys.size(1);
  const auto one_hot = at::eye(m, q.options()).expand({b, m, m});
  const auto kernel = at::ones({m, o.k()}, q.options());
  return convnn::nn::functional::conv_nn(q, keys, one_hot, kernel, {}, o);
}

// Expected weight_per_token when row i may only choose from `allowed[i, :]`.
at::Tensor expected_weight_per_token(const at::Tensor& q, const at::Tensor& keys,
                                     const at::Tensor& allowed, Similarity s, int64_t k, Rho rho) {
  const auto scores = all_scores(q, keys, s, allowed);
  const auto chosen = top_k_indicator(scores, k);
  if (rho == Rho::Uniform) return chosen;
  const auto masked = at::where(chosen.to(at::kBool), scores, at::full_like(scores, -INFINITY));
  return at::softmax(masked, -1);
}

// [N,M] bool: column j allowed for every row when drawn[j].
at::Tensor drawn_columns(const at::Tensor& drawn, int64_t n, int64_t m) {
  return at::zeros({m}, at::kBool).index_fill_(0, drawn, true).expand({n, m});
}

TEST(ConvNNProperties, RandomCandidatesChooseTheTopKOfTheSeededDraw) {
  Random random(5);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t m = random.integer(3, 10), r = random.integer(1, m - 1), k = random.integer(1, r);
    const int64_t n = random.integer(1, 6);
    const auto s = random.similarity();
    const auto q = random.normal({2, n, 3}), keys = random.normal({2, m, 3});
    const uint64_t seed = 100 + trial;
    const auto drawn = convnn::nn::functional::draw_candidates(m, r, seeded(seed), at::kCPU);
    const auto o = ConvNNFuncOptions(k).similarity(s).num_candidates(r).generator(seeded(seed));
    EXPECT_TRUE(AllClose(
        weight_per_token(q, keys, o),
        expected_weight_per_token(q, keys, drawn_columns(drawn, n, m), s, k, Rho::Uniform), 0.0))
        << "trial " << trial << " m=" << m << " r=" << r << " k=" << k;
  }
}

TEST(ConvNNProperties, IncludeSelfAddsTheQueryOnceWithItsRealScore) {
  Random random(6);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t m = random.integer(3, 10), r = random.integer(1, m - 1), k = random.integer(1, r);
    const auto q = random.normal({2, m, 3});
    const uint64_t seed = 200 + trial;
    const auto drawn = convnn::nn::functional::draw_candidates(m, r, seeded(seed), at::kCPU);
    const auto allowed = drawn_columns(drawn, m, m) | at::eye(m, at::kBool);
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " m=" << m << " r=" << r << " k=" << k);
    // Softmax over dot scores: a self slot with any other score would change every weight.
    const auto softmax = ConvNNFuncOptions(k)
                             .similarity(Similarity::Dot)
                             .rho(Rho::Softmax)
                             .num_candidates(r)
                             .include_self(true)
                             .generator(seeded(seed));
    EXPECT_TRUE(AllClose(weight_per_token(q, q, softmax),
                         expected_weight_per_token(q, q, allowed, Similarity::Dot, k, Rho::Softmax),
                         1e-12));
    // Gaussian ranks every query first among its own candidates: it is selected exactly once,
    // also when it was drawn anyway.
    const auto gaussian = ConvNNFuncOptions(k)
                              .similarity(Similarity::Gaussian)
                              .num_candidates(r)
                              .include_self(true)
                              .slot_order(SlotOrder::Index)
                              .generator(seeded(seed));
    const auto w = weight_per_token(q, q, gaussian);
    EXPECT_TRUE(at::equal(w.diagonal(0, 1, 2), at::ones({2, m}, at::kDouble)));
    EXPECT_TRUE((w <= 1).all().item<bool>());
    EXPECT_TRUE(at::equal(w.sum(-1), at::full({2, m}, double(k), at::kDouble)));
  }
}

TEST(ConvNNProperties, SameSeedGivesTheSameDrawAndAnotherSeedADifferentOne) {
  Random random(7);
  const auto q = random.normal({1, 16, 3});
  const auto run = [&](uint64_t seed) {
    return weight_per_token(q, q, ConvNNFuncOptions(2).num_candidates(4).generator(seeded(seed)));
  };
  EXPECT_TRUE(at::equal(run(1), run(1)));
  EXPECT_FALSE(at::equal(run(1), run(2)));
  EXPECT_TRUE(at::equal(convnn::nn::functional::draw_candidates(16, 4, seeded(3), at::kCPU),
                        convnn::nn::functional::draw_candidates(16, 4, seeded(3), at::kCPU)));
}

// ------------------------------------------------------------------------------ modules

template <typename Module>
void ExpectEvalDraws(Module module, const at::Tensor& input, bool fixed) {
  module->eval();
  const auto first = module->forward(input), second = module->forward(input);
  EXPECT_EQ(at::equal(first, second), fixed);
  module->train();
  EXPECT_FALSE(at::equal(module->forward(input), module->forward(input)))
      << "training draws a fresh set every forward";
}

TEST(ModuleProperties, EvalFixedGivesIdenticalOutputsAndFreshDrawsAgain) {
  using namespace convnn::nn;
  Random random(8);
  const auto spatial = random.normal({2, 3, 16}).to(at::kFloat);
  const auto tokens = random.normal({2, 16, 4}).to(at::kFloat);
  for (const auto eval : {EvalCandidates::Fixed, EvalCandidates::Fresh}) {
    SCOPED_TRACE(to_string(eval));
    const bool fixed = eval == EvalCandidates::Fixed;
    ExpectEvalDraws(
        ConvNN1d(ConvNN1dOptions(3, 3, 2).num_candidates(4).eval_candidates(eval).seed(1)), spatial,
        fixed);
    ExpectEvalDraws(
        ConvNNAttention(
            ConvNNAttentionOptions(4, 2, 2).num_candidates(4).eval_candidates(eval).seed(1)),
        tokens, fixed);
  }
}

TEST(ModuleProperties, FixedEvalDrawDependsOnlyOnTheEvalSeed) {
  using namespace convnn::nn;
  Random random(9);
  const auto input = random.normal({2, 3, 16}).to(at::kFloat);
  const auto eval_output = [&](uint64_t eval_seed) {
    torch::manual_seed(0);  // same parameters for every module
    ConvNN1d layer(ConvNN1dOptions(3, 3, 2).num_candidates(4).eval_seed(eval_seed));
    layer->eval();
    return layer->forward(input);
  };
  EXPECT_TRUE(at::equal(eval_output(5), eval_output(5)));
  EXPECT_FALSE(at::equal(eval_output(5), eval_output(6)));
}

// ------------------------------------------------------------------------------ duplicates

TEST(KnnAggregateProperties, DuplicateIndicesEqualOneGatheredCopyPerSlotForOutputAndGradient) {
  Random random(10);
  for (int trial = 0; trial < 15; ++trial) {
    const int64_t g = random.integer(1, 2), m = random.integer(1, 3), n = random.integer(1, 4);
    const int64_t c = random.integer(1, 3), k = random.integer(m + 1, m + 3);
    const bool depthwise = random.coin();
    const auto values = random.normal({g, m, c}).requires_grad_();
    const auto weights = random.normal({g, n, k});
    const auto indices = random.indices(m, {g, n, k});  // k > m: every row repeats an index
    const auto kernel = depthwise ? random.normal({c, k}) : random.normal({2, c, k});
    // One private row per slot: values[g, indices[g,i,s]] copied to row i*k+s.
    const auto slice = at::arange(g, at::kLong).view({g, 1, 1}).expand_as(indices);
    const auto copies = values.index({slice, indices}).reshape({g, n * k, c});
    const auto private_indices =
        at::arange(n * k, at::kLong).view({1, n, k}).expand({g, n, k}).contiguous();
    const auto shared = convnn::ops::knn_aggregate(values, weights, indices, kernel, c10::nullopt);
    const auto separate =
        convnn::ops::knn_aggregate(copies, weights, private_indices, kernel, c10::nullopt);
    EXPECT_TRUE(AllClose(shared, separate, kTight, kTight)) << "trial " << trial;
    const auto upstream = random.normal(shared.sizes());
    const auto grad_shared = torch::autograd::grad({shared}, {values}, {upstream})[0];
    const auto grad_separate = torch::autograd::grad({separate}, {values}, {upstream})[0];
    EXPECT_TRUE(AllClose(grad_shared, grad_separate, kTight, kTight)) << "trial " << trial;
  }
}

// ------------------------------------------------------------------------------ layouts

// Same values with transposed memory layout (a view when the tensor has two or more dims).
at::Tensor relayout(const at::Tensor& t) {
  if (t.dim() < 2) return t;
  return t.transpose(0, -1).contiguous().transpose(0, -1);
}

// Gradients of sum(output * upstream) with respect to `inputs`, keeping the graph for reuse.
std::vector<at::Tensor> grads(const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                              const at::Tensor& upstream) {
  return torch::autograd::grad({output}, inputs, {upstream}, /*retain_graph=*/true);
}

TEST(OpLayoutProperties, NonContiguousInputsAndUpstreamGradientsChangeNothing) {
  Random random(11);
  for (int trial = 0; trial < 15; ++trial) {
    const int64_t g = random.integer(1, 3), n = random.integer(2, 5), m = random.integer(2, 6);
    const int64_t d = random.integer(2, 4), k = random.integer(1, m);
    const auto s = random.similarity();
    const bool index_order = random.coin();
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " " << convnn::to_string(s));
    const auto q = random.normal({g, n, d}).requires_grad_(),
               keys = random.normal({g, m, d}).requires_grad_();
    const auto q_view = relayout(q), keys_view = relayout(keys);
    ASSERT_FALSE(q_view.is_contiguous());
    auto [scores, indices] =
        convnn::ops::knn_select(q, keys, k, convnn::to_string(s), c10::nullopt, index_order);
    auto [scores_v, indices_v] = convnn::ops::knn_select(q_view, keys_view, k, convnn::to_string(s),
                                                         c10::nullopt, index_order);
    EXPECT_TRUE(at::equal(indices, indices_v));
    EXPECT_TRUE(AllClose(scores_v, scores, kTight, kTight));
    // One value per (g, i), broadcast over the k slots: a stride-0 upstream gradient.
    const auto per_row = random.normal({g, n, 1});
    const auto expanded = per_row.expand({g, n, k});
    const auto want = grads(scores, {q, keys}, expanded.contiguous());
    const auto got = grads(scores_v, {q, keys}, expanded);
    EXPECT_TRUE(AllClose(got[0], want[0], kTight, kTight));
    EXPECT_TRUE(AllClose(got[1], want[1], kTight, kTight));

    const int64_t c = random.integer(1, 3);
    const auto values = random.normal({g, m, c}).requires_grad_();
    const auto weights = random.normal({g, n, k}).requires_grad_();
    const auto kernel = random.normal({c + 1, c, k}).requires_grad_();
    const auto out = convnn::ops::knn_aggregate(values, weights, indices, kernel, c10::nullopt);
    const auto out_v = convnn::ops::knn_aggregate(
        relayout(values), relayout(weights), relayout(indices), relayout(kernel), c10::nullopt);
    EXPECT_TRUE(AllClose(out_v, out, kTight, kTight));
    const auto upstream = relayout(random.normal(out.sizes()));
    const auto want_agg = grads(out, {values, weights, kernel}, upstream.contiguous());
    const auto got_agg = grads(out_v, {values, weights, kernel}, upstream);
    for (size_t j = 0; j < want_agg.size(); ++j) {
      EXPECT_TRUE(AllClose(got_agg[j], want_agg[j], kTight, kTight)) << "input " << j;
    }
  }
}

// ------------------------------------------------------------------------------ empty batches

// Forward on an empty batch gives the right (empty) shape, and backward runs.
template <typename F>
void ExpectEmptyBatchWorks(F&& forward, const at::Tensor& input, c10::IntArrayRef expected_shape) {
  const auto x = input.detach().requires_grad_();
  const auto y = forward(x);
  EXPECT_EQ(y.sizes(), expected_shape);
  y.sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().sizes(), x.sizes());
}

TEST(EmptyBatchProperties, GEqualsZeroThroughTheCoreOps) {
  const auto q = at::zeros({0, 4, 3}, at::kDouble), keys = at::zeros({0, 5, 3}, at::kDouble);
  for (const auto s : kSimilarities) {
    ExpectEmptyBatchWorks(
        [&](const at::Tensor& x) {
          return std::get<0>(
              convnn::ops::knn_select(x, keys, 2, convnn::to_string(s), c10::nullopt, true));
        },
        q, {0, 4, 2});
  }
  const auto weights = at::zeros({0, 4, 2}, at::kDouble);
  const auto indices = at::zeros({0, 4, 2}, at::kLong);
  for (const auto& kernel : {at::ones({3, 2}, at::kDouble), at::ones({6, 3, 2}, at::kDouble)}) {
    ExpectEmptyBatchWorks(
        [&](const at::Tensor& x) {
          return convnn::ops::knn_aggregate(x, weights, indices, kernel, c10::nullopt);
        },
        at::zeros({0, 5, 3}, at::kDouble), {0, 4, kernel.size(0)});
  }
}

TEST(EmptyBatchProperties, BEqualsZeroThroughConvNNAndTheFunctionalSpatialForms) {
  const auto tokens = at::zeros({0, 6, 4}, at::kDouble);
  const auto kernel = at::ones({2, 3}, at::kDouble);
  for (const auto& o :
       {ConvNNFuncOptions(3).heads(2),
        ConvNNFuncOptions(3).heads(2).num_candidates(4).include_self(true),
        ConvNNFuncOptions(3).heads(2).mask(convnn::nn::functional::causal_mask(6))}) {
    ExpectEmptyBatchWorks(
        [&](const at::Tensor& x) {
          return convnn::nn::functional::conv_nn(x, x, x, kernel, {}, o);
        },
        tokens, {0, 6, 4});
  }
  const auto spatial_kernel = at::ones({4, 4, 3}, at::kDouble);
  ExpectEmptyBatchWorks(
      [&](const at::Tensor& x) {
        return convnn::nn::functional::conv_nn1d(x, spatial_kernel, {},
                                                 ConvNNFuncOptions(3).padding(1));
      },
      at::zeros({0, 4, 5}, at::kDouble), {0, 4, 5});
  ExpectEmptyBatchWorks(
      [&](const at::Tensor& x) {
        return convnn::nn::functional::conv_nn2d(
            x, spatial_kernel, {}, ConvNNFuncOptions(3).padding(1).coordinates(true).alpha(0.5));
      },
      at::zeros({0, 4, 3, 3}, at::kDouble), {0, 4, 3, 3});
}

TEST(EmptyBatchProperties, BEqualsZeroThroughEveryLayer) {
  using namespace convnn::nn;
  ConvNN1d conv1d(ConvNN1dOptions(4, 2, 3).padding(1));
  ConvNN2d conv2d(ConvNN2dOptions(4, 2, 3).padding(1).num_candidates(5).include_self(true));
  ConvNNAttention attention(ConvNNAttentionOptions(4, 2, 3).causal(true));
  BranchingConv2d branching(BranchingConv2dOptions(4, 6, 3));
  ExpectEmptyBatchWorks([&](const at::Tensor& x) { return conv1d(x); }, at::zeros({0, 4, 5}),
                        {0, 2, 5});
  ExpectEmptyBatchWorks([&](const at::Tensor& x) { return conv2d(x); }, at::zeros({0, 4, 3, 3}),
                        {0, 2, 3, 3});
  ExpectEmptyBatchWorks([&](const at::Tensor& x) { return attention(x); }, at::zeros({0, 5, 4}),
                        {0, 5, 4});
  ExpectEmptyBatchWorks([&](const at::Tensor& x) { return branching(x); }, at::zeros({0, 4, 3, 3}),
                        {0, 6, 3, 3});
}

}  // namespace
}  // namespace property_test
