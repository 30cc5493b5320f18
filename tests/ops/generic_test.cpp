// The device-generic ops (src/ops/generic), run on CPU tensors: the same indices as the plain-ATen
// reference and the fused CPU ops, outputs and gradients equal to both in float64, over every
// similarity, rho, kernel kind, mask (bool, additive, per-slice, causal, rows with fewer than K
// valid candidates, fully masked rows), slot order, K = 1 and K = M, with non-contiguous inputs;
// float64 finite differences through the generic forward and backward; bitwise-equal repeated
// backward passes; blocks of a few KB giving the one-block selection bit for bit; shape-only runs on
// meta tensors (a tensor made on the wrong device or a read back to the host fails there); the
// NaN/+inf error of the fused ops; and the dispatcher giving the generic kernels to every backend
// without a fused one.
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "convnn/ops/knn_ops.h"
#include "ops/checks.h"
#include "ops/composite/knn_attention_composed.h"
#include "ops/generic/generic.h"
#include "ops/reference/reference.h"
#include "support/assert_close.h"
#include "support/enum_lists.h"
#include "support/gradcheck.h"

namespace generic_test {  // apart from the files of its unity batch (tests/CMakeLists.txt)

namespace {

namespace generic = convnn::ops::generic;
using convnn::Rho;
using convnn::Similarity;
using convnn::testing::AllClose;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kTemperature = 0.7;
const std::vector<Similarity> kSimilarities = convnn::testing::all_similarities();

enum class MaskKind { None, Bool, Additive, AdditivePerSlice, Causal, FewValid, FullyMaskedRows };
constexpr int kMaskKinds = 7;

struct Case {
  int64_t g, n, m, d, c, k;
  bool depthwise, bias;
  MaskKind mask;
  Similarity similarity;
  Rho rho;
  bool index_order;
  std::string name() const {
    return "G=" + std::to_string(g) + " N=" + std::to_string(n) + " M=" + std::to_string(m) +
           " K=" + std::to_string(k) + (depthwise ? " depthwise" : " standard") + (bias ? " bias" : "") +
           " mask=" + std::to_string(static_cast<int>(mask)) + " " + convnn::to_string(similarity) + " " +
           convnn::to_string(rho) + (index_order ? " index-order" : " score-order");
  }
};

// gtest shows each parameter by its name, not its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

torch::Tensor make_mask(const Case& c) {
  const auto f64 = torch::kDouble;
  switch (c.mask) {
    case MaskKind::None: return {};
    case MaskKind::Bool: return torch::rand({c.n, c.m}, f64) > 0.3;
    case MaskKind::Additive:
      return torch::zeros({c.n, c.m}, f64).masked_fill(torch::rand({c.n, c.m}, f64) < 0.3, kNegInf);
    case MaskKind::AdditivePerSlice:
      return torch::zeros({c.g, c.n, c.m}, f64).masked_fill(torch::rand({c.g, c.n, c.m}, f64) < 0.3, kNegInf);
    case MaskKind::Causal: return torch::ones({c.n, c.m}, torch::kBool).tril();
    case MaskKind::FewValid: {
      // Row i may select only the candidates below i % 3: fewer than K for most rows.
      const auto column = torch::arange(c.m).view({1, c.m}), row = torch::arange(c.n).view({c.n, 1});
      return (column < row.remainder(3)).expand({c.g, c.n, c.m}).clone();
    }
    case MaskKind::FullyMaskedRows: {
      auto allowed = torch::rand({c.n, c.m}, f64) > 0.4;
      allowed.index_put_({torch::arange(0, c.n, 2)}, false);
      return allowed;
    }
  }
  return {};
}

struct Inputs {
  torch::Tensor queries, keys, values, kernel, bias, mask;  // bias and mask may be undefined
  c10::optional<torch::Tensor> optional_bias() const {
    return bias.defined() ? c10::optional<torch::Tensor>(bias) : c10::nullopt;
  }
  c10::optional<torch::Tensor> optional_mask() const {
    return mask.defined() ? c10::optional<torch::Tensor>(mask) : c10::nullopt;
  }
};

// Float64 inputs; queries and values are non-contiguous views (a transpose of a larger buffer).
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

// Every similarity x mask x slot order, K = 1, 3 and M, square (causal needs N = M).
std::vector<Case> select_sweep() {
  std::vector<Case> cases;
  for (const auto similarity : kSimilarities) {
    for (int mask = 0; mask < kMaskKinds; ++mask) {
      for (const bool index_order : {false, true}) {
        for (const int64_t k : {int64_t{1}, int64_t{3}, int64_t{7}}) {
          cases.push_back({2, 7, 7, 3, 2, k, true, false, static_cast<MaskKind>(mask), similarity,
                           Rho::Softmax, index_order});
        }
      }
    }
  }
  return cases;
}

// Every similarity x rho x kernel kind, the masks, K and slot orders cycling through the cases.
std::vector<Case> attention_sweep() {
  std::vector<Case> cases;
  int variant = 0;
  for (const auto similarity : kSimilarities) {
    for (const auto rho : {Rho::Uniform, Rho::Mean, Rho::Softmax}) {
      for (const bool depthwise : {true, false}) {
        ++variant;
        const int64_t k = variant % 3 == 0 ? 6 : (variant % 3 == 1 ? 1 : 3);
        // Every third case over enough slices for the fused CPU backward's tasks of whole slices.
        cases.push_back({variant % 3 == 2 ? 17 : 2, 6, 6, 3, 3, k, depthwise, variant % 2 == 0,
                         static_cast<MaskKind>(variant % kMaskKinds), similarity, rho, variant % 4 < 2});
      }
    }
  }
  return cases;
}

using AttentionResult = std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor>;

AttentionResult generic_attention(const Case& c, const Inputs& in) {
  return generic::knn_attention(in.queries, in.keys, in.values, in.kernel, in.optional_bias(), c.k,
                                convnn::to_string(c.similarity), in.optional_mask(), c.index_order,
                                convnn::to_string(c.rho), kTemperature);
}

AttentionResult fused_attention(const Case& c, const Inputs& in) {
  return convnn::ops::knn_attention(in.queries, in.keys, in.values, in.kernel, in.optional_bias(), c.k,
                                    convnn::to_string(c.similarity), in.optional_mask(), c.index_order,
                                    convnn::to_string(c.rho), kTemperature);
}

// Restores the block budget when a test that shrank it ends.
class BlockBudget {
 public:
  explicit BlockBudget(int64_t bytes) : saved_(generic::block_bytes()) { generic::set_block_bytes(bytes); }
  ~BlockBudget() { generic::set_block_bytes(saved_); }

 private:
  int64_t saved_;
};

TEST(GenericSelect, EqualsReferenceAndFusedForEveryMaskSimilarityAndSlotOrder) {
  uint64_t seed = 10;
  for (const auto& c : select_sweep()) {
    SCOPED_TRACE(c.name());
    const auto in = make_inputs(c, ++seed);
    const auto name = convnn::to_string(c.similarity);
    auto [scores, indices] = generic::knn_select(in.queries, in.keys, c.k, name, in.optional_mask(), c.index_order);
    auto [ref_scores, ref_indices] = convnn::reference::knn_select(in.queries, in.keys, c.k, c.similarity,
                                                                   in.optional_mask(), c.index_order);
    auto [fused_scores, fused_indices] =
        convnn::ops::knn_select(in.queries, in.keys, c.k, name, in.optional_mask(), c.index_order);
    EXPECT_TRUE(torch::equal(indices, ref_indices));
    EXPECT_TRUE(torch::equal(indices, fused_indices));
    EXPECT_TRUE(AllClose(scores, ref_scores, 1e-14, 1e-14));
    EXPECT_TRUE(AllClose(scores, fused_scores, 1e-14, 1e-14));
  }
}

TEST(GenericSelect, LowerIndexWinsTiesOnAGrid) {
  // Integer grid coordinates: mirror neighbours are exactly equidistant, so every row has ties.
  const auto grid = torch::stack(torch::meshgrid({torch::arange(5), torch::arange(5)}, "ij"), -1)
                        .reshape({1, 25, 2}).to(torch::kDouble);
  for (const auto similarity : kSimilarities) {
    for (const bool index_order : {false, true}) {
      const auto name = convnn::to_string(similarity);
      SCOPED_TRACE(std::string(name) + (index_order ? " index-order" : ""));
      auto [scores, indices] = generic::knn_select(grid, grid, 9, name, c10::nullopt, index_order);
      auto [ref_scores, ref_indices] =
          convnn::reference::knn_select(grid, grid, 9, similarity, c10::nullopt, index_order);
      EXPECT_TRUE(torch::equal(indices, ref_indices));
      EXPECT_TRUE(AllClose(scores, ref_scores, 1e-14, 1e-14));
    }
  }
}

TEST(GenericSelect, IntegerInputsSelectWhatTheFusedOpAndTheReferenceSelect) {
  // Small integers: the ranking keys are exact, so rows have many exact ties, which every path
  // must break the same way (the lower index first). Cosine's keys are not all exact, but every
  // path computes them from exact dot products and norms in the same order of roundings, so they
  // are the same bits on every path (docs/operator.md, "Ties").
  torch::manual_seed(2911);
  for (const auto similarity : kSimilarities) {
    for (const auto dtype : {torch::kDouble, torch::kFloat}) {
      for (const int64_t d : {2, 3, 5}) {
        const auto queries = torch::randint(-3, 4, {2, 6, d}).to(dtype);
        const auto keys = torch::randint(-3, 4, {2, 12, d}).to(dtype);
        for (const bool index_order : {false, true}) {
          const auto name = convnn::to_string(similarity);
          SCOPED_TRACE(std::string(name) + " " + c10::toString(dtype) + " D " + std::to_string(d) +
                       (index_order ? " index-order" : ""));
          const auto generic_indices = std::get<1>(generic::knn_select(queries, keys, 4, name, c10::nullopt, index_order));
          const auto fused_indices = std::get<1>(convnn::ops::knn_select(queries, keys, 4, name, c10::nullopt, index_order));
          const auto reference_indices =
              std::get<1>(convnn::reference::knn_select(queries, keys, 4, similarity, c10::nullopt, index_order));
          EXPECT_TRUE(torch::equal(generic_indices, fused_indices));
          EXPECT_TRUE(torch::equal(generic_indices, reference_indices));
        }
      }
    }
  }
}

TEST(GenericSelect, CosineOfExactlyOrthogonalIntegerRowsIsExactlyZeroOnEveryPath) {
  // The query (2, 3) against: a candidate of positive cosine, one of negative cosine, then four
  // exactly orthogonal ones, (3, -2) times 1, 9, 2 and 3. Normalising the rows before the product
  // scored (-27, 18) 5.6e-17 in float64 (and (-9, 6) 3e-8 in float32), ranking it above the lower
  // indices at exactly 0. Three slots: the positive one, then the two lowest orthogonal indices,
  // with scores exactly 0.
  const auto queries = torch::tensor({2, 3}).reshape({1, 1, 2});
  const auto keys = torch::tensor({3, 1, -1, -1, 3, -2, -27, 18, -6, 4, -9, 6}).reshape({1, 6, 2});
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    const auto q = queries.to(dtype), k = keys.to(dtype);
    const auto expected_indices = torch::tensor({0, 2, 3}, torch::kLong).reshape({1, 1, 3});
    const std::vector<std::pair<const char*, std::tuple<at::Tensor, at::Tensor>>> paths{
        {"fused", convnn::ops::knn_select(q, k, 3, "cosine", c10::nullopt, false)},
        {"generic", generic::knn_select(q, k, 3, "cosine", c10::nullopt, false)},
        {"reference", convnn::reference::knn_select(q, k, 3, Similarity::Cosine, c10::nullopt, false)}};
    for (const auto& [path, selection] : paths) {
      SCOPED_TRACE(std::string(path) + " " + c10::toString(dtype));
      const auto& [scores, indices] = selection;
      EXPECT_TRUE(torch::equal(indices, expected_indices)) << indices;
      EXPECT_GT(scores[0][0][0].item<double>(), 0.0);
      EXPECT_EQ(scores[0][0][1].item<double>(), 0.0);
      EXPECT_EQ(scores[0][0][2].item<double>(), 0.0);
    }
  }
}

TEST(GenericAttention, Float32AndBFloat16AgreeWithTheFusedOp) {
  uint64_t seed = 110;
  for (const auto similarity : kSimilarities) {
    const Case c{2, 20, 30, 8, 4, 5, similarity != Similarity::Dot, true, MaskKind::Bool, similarity,
                 Rho::Softmax, similarity == Similarity::Cosine};
    SCOPED_TRACE(c.name());
    const auto in64 = make_inputs(c, ++seed);
    auto [ref_output, ref_scores, ref_indices, ref_weights] = generic_attention(c, in64);
    for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
      SCOPED_TRACE(c10::toString(dtype));
      Inputs low = in64;
      for (auto* t : {&low.queries, &low.keys, &low.values, &low.kernel, &low.bias}) *t = t->to(dtype);
      auto [output, scores, indices, weights] = generic_attention(c, low);
      auto [fused_output, fused_scores, fused_indices, fused_weights] = fused_attention(c, low);
      EXPECT_EQ(output.scalar_type(), dtype);
      EXPECT_TRUE(torch::equal(indices, fused_indices));
      // bfloat16 keeps 8 bits: outputs of about 10 terms agree to a few of its epsilons.
      const double tolerance = dtype == torch::kFloat ? 1e-5 : 4e-2;
      EXPECT_TRUE(AllClose(output, fused_output, tolerance, tolerance));
      EXPECT_TRUE(AllClose(weights, fused_weights, tolerance, tolerance));
      if (dtype == torch::kFloat) {
        EXPECT_TRUE(torch::equal(indices, ref_indices));
        EXPECT_TRUE(AllClose(output, ref_output, tolerance, tolerance));
      }
    }
  }
}

TEST(GenericAttention, EmptyShapesGiveTheFusedOpsShapes) {
  const auto f64 = torch::kDouble;
  // N = 0, G = 0 and C = 0 (every output is the bias).
  for (const auto& [g, n, c] : {std::tuple<int64_t, int64_t, int64_t>{2, 0, 3}, {0, 4, 3}, {2, 4, 0}}) {
    SCOPED_TRACE("G=" + std::to_string(g) + " N=" + std::to_string(n) + " C=" + std::to_string(c));
    const auto queries = torch::randn({g, n, 2}, f64), keys = torch::randn({g, 5, 2}, f64);
    const auto values = torch::randn({g, 5, c}, f64), kernel = torch::randn({3, c, 2}, f64);
    const auto bias = torch::randn({3}, f64);
    auto mine = generic::knn_attention(queries, keys, values, kernel, bias, 2, "dot", c10::nullopt, false,
                                       "softmax", 1.0);
    auto fused = convnn::ops::knn_attention(queries, keys, values, kernel, bias, 2, "dot", c10::nullopt,
                                            false, "softmax", 1.0);
    EXPECT_TRUE(AllClose(std::get<0>(mine), std::get<0>(fused), 1e-14, 1e-14));
    EXPECT_TRUE(torch::equal(std::get<2>(mine), std::get<2>(fused)));
    auto grads = generic::knn_attention_backward(torch::ones_like(std::get<0>(mine)), queries, keys, values,
                                                 kernel, std::get<1>(mine), std::get<2>(mine), std::get<3>(mine),
                                                 "dot", "softmax", 1.0, {true, true, true, true, true});
    EXPECT_TRUE(torch::equal(std::get<1>(grads), torch::zeros_like(keys)));
    EXPECT_TRUE(torch::equal(std::get<2>(grads), torch::zeros_like(values)));
  }
}

TEST(GenericAggregate, EqualsReferenceAndFused) {
  uint64_t seed = 20;
  for (const auto& c : attention_sweep()) {
    SCOPED_TRACE(c.name());
    const auto in = make_inputs(c, ++seed);
    const auto weights = torch::randn({c.g, c.n, c.k}, torch::kDouble);
    const auto indices = torch::randint(c.m, {c.g, c.n, c.k});
    const auto output = generic::knn_aggregate(in.values, weights, indices, in.kernel, in.optional_bias());
    EXPECT_TRUE(AllClose(output, convnn::reference::knn_aggregate(in.values, weights, indices, in.kernel,
                                                                  in.optional_bias()), 1e-13, 1e-13));
    EXPECT_TRUE(AllClose(output, convnn::ops::knn_aggregate(in.values, weights, indices, in.kernel,
                                                            in.optional_bias()), 1e-13, 1e-13));
  }
}

TEST(GenericAttention, EqualsReferenceAndFused) {
  uint64_t seed = 30;
  for (const auto& c : attention_sweep()) {
    SCOPED_TRACE(c.name());
    const auto in = make_inputs(c, ++seed);
    auto [output, scores, indices, weights] = generic_attention(c, in);
    auto [ref_output, ref_scores, ref_indices, ref_weights] = convnn::reference::knn_attention(
        in.queries, in.keys, in.values, in.kernel, in.optional_bias(), c.k, c.similarity,
        in.optional_mask(), c.index_order, c.rho, kTemperature);
    auto [fused_output, fused_scores, fused_indices, fused_weights] = fused_attention(c, in);
    EXPECT_TRUE(torch::equal(indices, ref_indices));
    EXPECT_TRUE(torch::equal(indices, fused_indices));
    EXPECT_TRUE(AllClose(scores, ref_scores, 1e-14, 1e-14));
    EXPECT_TRUE(AllClose(weights, ref_weights, 1e-14, 1e-14));
    EXPECT_TRUE(AllClose(weights, fused_weights, 1e-14, 1e-14));
    EXPECT_TRUE(AllClose(output, ref_output, 1e-12, 1e-12));
    EXPECT_TRUE(AllClose(output, fused_output, 1e-12, 1e-12));
  }
}

TEST(GenericBackward, SelectAndAggregateEqualReferenceAndFused) {
  uint64_t seed = 40;
  for (const auto& c : attention_sweep()) {
    SCOPED_TRACE(c.name());
    const auto in = make_inputs(c, ++seed);
    const auto name = convnn::to_string(c.similarity);
    auto [scores, indices] = convnn::reference::knn_select(in.queries, in.keys, c.k, c.similarity,
                                                           in.optional_mask(), c.index_order);
    const auto grad_scores = torch::randn_like(scores);
    auto [grad_q, grad_k] = generic::knn_select_backward(grad_scores, in.queries, in.keys, indices, scores, name);
    auto [ref_q, ref_k] = convnn::reference::knn_select_backward(grad_scores, in.queries, in.keys, indices,
                                                                 scores, c.similarity);
    auto [fused_q, fused_k] = convnn::ops::knn_select_backward(grad_scores, in.queries, in.keys, indices,
                                                               scores, name);
    EXPECT_TRUE(AllClose(grad_q, ref_q, 1e-13, 1e-13));
    EXPECT_TRUE(AllClose(grad_k, ref_k, 1e-13, 1e-13));
    EXPECT_TRUE(AllClose(grad_q, fused_q, 1e-13, 1e-13));
    EXPECT_TRUE(AllClose(grad_k, fused_k, 1e-13, 1e-13));

    const auto weights = convnn::reference::rho_weights(scores, c.rho, kTemperature);
    const auto grad_output = torch::randn({c.g, c.n, in.kernel.dim() == 2 ? c.c : c.c + 1}, torch::kDouble);
    const std::array<bool, 4> all{true, true, true, true};
    const auto mine = generic::knn_aggregate_backward(grad_output, in.values, weights, indices, in.kernel, all);
    const auto ref = convnn::reference::knn_aggregate_backward(grad_output, in.values, weights, indices, in.kernel, all);
    const auto fused = convnn::ops::knn_aggregate_backward(grad_output, in.values, weights, indices, in.kernel, all);
    EXPECT_TRUE(AllClose(std::get<0>(mine), std::get<0>(ref), 1e-13, 1e-13));
    EXPECT_TRUE(AllClose(std::get<1>(mine), std::get<1>(ref), 1e-13, 1e-13));
    EXPECT_TRUE(AllClose(std::get<2>(mine), std::get<2>(ref), 1e-13, 1e-13));
    EXPECT_TRUE(AllClose(std::get<3>(mine), std::get<3>(ref), 1e-13, 1e-13));
    EXPECT_TRUE(AllClose(std::get<0>(mine), std::get<0>(fused), 1e-13, 1e-13));
    EXPECT_TRUE(AllClose(std::get<2>(mine), std::get<2>(fused), 1e-13, 1e-13));
  }
}

TEST(GenericBackward, AttentionEqualsFusedAndHonoursOutputMask) {
  uint64_t seed = 50;
  for (const auto& c : attention_sweep()) {
    SCOPED_TRACE(c.name());
    const auto in = make_inputs(c, ++seed);
    at::Tensor output, scores, indices, weights;
    std::tie(output, scores, indices, weights) = fused_attention(c, in);
    const auto grad_output = torch::randn_like(output);
    const auto run = [&](bool use_generic, std::array<bool, 5> wanted) {
      const auto f = use_generic ? generic::knn_attention_backward
                                 : [](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c2,
                                      const at::Tensor& d, const at::Tensor& e, const at::Tensor& f2,
                                      const at::Tensor& g, const at::Tensor& h, c10::string_view s,
                                      c10::string_view r, double t, std::array<bool, 5> mask) {
                                     return convnn::ops::knn_attention_backward(a, b, c2, d, e, f2, g, h,
                                                                                std::string(s), std::string(r),
                                                                                t, mask);
                                   };
      return f(grad_output, in.queries, in.keys, in.values, in.kernel, scores, indices, weights,
               convnn::to_string(c.similarity), convnn::to_string(c.rho), kTemperature, wanted);
    };
    const auto mine = run(true, {true, true, true, true, c.bias});
    const auto fused = run(false, {true, true, true, true, c.bias});
    const bool score_gradient = c.rho == Rho::Softmax;
    EXPECT_EQ(std::get<0>(mine).defined(), score_gradient);
    EXPECT_EQ(std::get<1>(mine).defined(), score_gradient);
    if (score_gradient) {
      EXPECT_TRUE(AllClose(std::get<0>(mine), std::get<0>(fused), 1e-12, 1e-12));
      EXPECT_TRUE(AllClose(std::get<1>(mine), std::get<1>(fused), 1e-12, 1e-12));
    }
    EXPECT_TRUE(AllClose(std::get<2>(mine), std::get<2>(fused), 1e-12, 1e-12));
    EXPECT_TRUE(AllClose(std::get<3>(mine), std::get<3>(fused), 1e-12, 1e-12));
    EXPECT_EQ(std::get<4>(mine).defined(), c.bias);
    if (c.bias) EXPECT_TRUE(AllClose(std::get<4>(mine), std::get<4>(fused), 1e-12, 1e-12));
    // Only what is asked for comes back.
    const auto values_only = run(true, {false, false, true, false, false});
    EXPECT_FALSE(std::get<0>(values_only).defined());
    EXPECT_FALSE(std::get<1>(values_only).defined());
    EXPECT_TRUE(torch::equal(std::get<2>(values_only), std::get<2>(mine)));
    EXPECT_FALSE(std::get<3>(values_only).defined());
    EXPECT_FALSE(std::get<4>(values_only).defined());
    const auto aggregate_mask = generic::knn_aggregate_backward(grad_output, in.values, weights, indices,
                                                                in.kernel, {false, true, false, false});
    EXPECT_FALSE(std::get<0>(aggregate_mask).defined());
    EXPECT_TRUE(std::get<1>(aggregate_mask).defined());
    EXPECT_FALSE(std::get<2>(aggregate_mask).defined());
    EXPECT_FALSE(std::get<3>(aggregate_mask).defined());
  }
}

// The generic forward and backward as one autograd node, so that finite differences check them.
class GenericAttentionFunction : public torch::autograd::Function<GenericAttentionFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const torch::Tensor& queries, const torch::Tensor& keys,
                                                const torch::Tensor& values, const torch::Tensor& kernel,
                                                const torch::Tensor& bias, const Case& c,
                                                const torch::Tensor& mask) {
    auto [output, scores, indices, weights] = generic::knn_attention(
        queries, keys, values, kernel, bias, c.k, convnn::to_string(c.similarity),
        mask.defined() ? c10::optional<torch::Tensor>(mask) : c10::nullopt, c.index_order,
        convnn::to_string(c.rho), kTemperature);
    ctx->save_for_backward({queries, keys, values, kernel, scores, indices, weights});
    ctx->saved_data["similarity"] = std::string(convnn::to_string(c.similarity));
    ctx->saved_data["rho"] = std::string(convnn::to_string(c.rho));
    return {output};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    auto [dq, dk, dv, dw, db] = generic::knn_attention_backward(
        grads[0], s[0], s[1], s[2], s[3], s[4], s[5], s[6], ctx->saved_data["similarity"].toStringRef(),
        ctx->saved_data["rho"].toStringRef(), kTemperature, {true, true, true, true, true});
    return {dq, dk, dv, dw, db, torch::Tensor(), torch::Tensor()};
  }
};

TEST(GenericGradients, PassFiniteDifferencesInFloat64) {
  uint64_t seed = 60;
  for (const auto similarity : kSimilarities) {
    for (const bool depthwise : {true, false}) {
      const Case c{2, 5, 6, 3, 2, 3, depthwise, true, depthwise ? MaskKind::Bool : MaskKind::AdditivePerSlice,
                   similarity, Rho::Softmax, !depthwise};
      SCOPED_TRACE(c.name());
      auto in = make_inputs(c, ++seed);
      std::vector<torch::Tensor> leaves{in.queries, in.keys, in.values, in.kernel, in.bias};
      for (auto& t : leaves) t = t.detach().clone().requires_grad_();
      const auto f = [&](const std::vector<torch::Tensor>& x) {
        return GenericAttentionFunction::apply(x[0], x[1], x[2], x[3], x[4], c, in.mask)[0];
      };
      EXPECT_TRUE(convnn::testing::GradCheck(f, leaves));
    }
  }
}

TEST(GenericGradients, RepeatedBackwardPassesAreBitwiseEqualAcrossThreadCounts) {
  // K = M and many queries: every key row receives many terms, where atomics would reorder sums.
  const Case c{2, 120, 16, 8, 6, 16, false, true, MaskKind::None, Similarity::ScaledDot, Rho::Softmax, false};
  const auto in = make_inputs(c, 70);
  at::Tensor output, scores, indices, weights;
  std::tie(output, scores, indices, weights) = generic_attention(c, in);
  const auto grad_output = torch::randn_like(output);
  const auto backward = [&] {
    return generic::knn_attention_backward(grad_output, in.queries, in.keys, in.values, in.kernel, scores,
                                           indices, weights, "scaled_dot", "softmax", kTemperature,
                                           {true, true, true, true, true});
  };
  const auto first = backward();
  const int threads = at::get_num_threads();
  for (const int pass_threads : {1, 3, 4}) {
    at::set_num_threads(pass_threads);
    const auto again = backward();
    at::set_num_threads(threads);
    EXPECT_TRUE(torch::equal(std::get<0>(first), std::get<0>(again)));
    EXPECT_TRUE(torch::equal(std::get<1>(first), std::get<1>(again)));
    EXPECT_TRUE(torch::equal(std::get<2>(first), std::get<2>(again)));
    EXPECT_TRUE(torch::equal(std::get<3>(first), std::get<3>(again)));
  }
}

TEST(GenericBlocks, ManySmallBlocksGiveTheOneBlockResult) {
  const Case c{3, 40, 30, 5, 4, 5, false, true, MaskKind::AdditivePerSlice, Similarity::Gaussian,
               Rho::Softmax, false};
  const auto in = make_inputs(c, 80);
  const auto select = [&](const char* similarity) {
    return generic::knn_select(in.queries, in.keys, c.k, similarity, in.optional_mask(), true);
  };
  const auto one_block = generic_attention(c, in);
  const auto cosine_one = select("cosine"), chebyshev_one = select("chebyshev");
  const auto aggregate = [&] {
    return generic::knn_aggregate(in.values, std::get<3>(one_block), std::get<2>(one_block), in.kernel,
                                  in.optional_bias());
  };
  const auto aggregate_one = aggregate();
  // One row of 30 candidates costs more than 1 KB: every block is a single row of a single slice.
  const BlockBudget tiny(1024);
  const auto many_blocks = generic_attention(c, in);
  // The selection, and everything the distance similarities compute one coordinate at a time, is
  // the same bit for bit.
  EXPECT_TRUE(torch::equal(std::get<1>(many_blocks), std::get<1>(one_block)));
  EXPECT_TRUE(torch::equal(std::get<2>(many_blocks), std::get<2>(one_block)));
  EXPECT_TRUE(torch::equal(std::get<3>(many_blocks), std::get<3>(one_block)));
  const auto chebyshev_many = select("chebyshev");
  EXPECT_TRUE(torch::equal(std::get<0>(chebyshev_many), std::get<0>(chebyshev_one)));
  EXPECT_TRUE(torch::equal(std::get<1>(chebyshev_many), std::get<1>(chebyshev_one)));
  const auto cosine_many = select("cosine");
  EXPECT_TRUE(torch::equal(std::get<1>(cosine_many), std::get<1>(cosine_one)));
  // Matrix products (the dot similarities, the aggregation) may sum in another order for another
  // block shape: equal to the last bits.
  EXPECT_TRUE(AllClose(std::get<0>(cosine_many), std::get<0>(cosine_one), 0, 4e-16));
  EXPECT_TRUE(AllClose(std::get<0>(many_blocks), std::get<0>(one_block), 0, 4e-16));
  EXPECT_TRUE(AllClose(aggregate(), aggregate_one, 0, 4e-16));
}

// The backward runs block by block too: row gradients are copied, the key, value, kernel and bias
// sums over rows are added block after block in the accumulation type. Float64 and bfloat16.
TEST(GenericBlocks, AttentionBackwardInManyBlocksEqualsOneBlock) {
  const Case c{3, 40, 30, 5, 4, 5, false, true, MaskKind::AdditivePerSlice, Similarity::Gaussian,
               Rho::Softmax, true};
  for (const auto dtype : {at::kDouble, at::kBFloat16}) {
    SCOPED_TRACE(::testing::Message() << dtype);
    auto in = make_inputs(c, 81);
    for (auto* t : {&in.queries, &in.keys, &in.values, &in.kernel, &in.bias, &in.mask}) *t = t->to(dtype);
    at::Tensor output, scores, indices, weights;
    std::tie(output, scores, indices, weights) = generic_attention(c, in);
    const auto grad_output = torch::randn_like(output);
    const auto backward = [&] {
      return generic::knn_attention_backward(grad_output, in.queries, in.keys, in.values, in.kernel, scores,
                                             indices, weights, "gaussian", "softmax", kTemperature,
                                             {true, true, true, true, true});
    };
    const auto one_block = backward();
    const BlockBudget tiny(1024);  // every block a single row of a single slice
    const auto many_blocks = backward();
    // Rows sum in another order, and reductions over another shape may round differently: equal
    // to rounding (bfloat16 keeps its sums over blocks in float32).
    const double tolerance = dtype == at::kDouble ? 1e-14 : 1e-2;
    for (const auto& [many, one] : {std::pair{std::get<0>(many_blocks), std::get<0>(one_block)},
                                    std::pair{std::get<1>(many_blocks), std::get<1>(one_block)},
                                    std::pair{std::get<2>(many_blocks), std::get<2>(one_block)},
                                    std::pair{std::get<3>(many_blocks), std::get<3>(one_block)},
                                    std::pair{std::get<4>(many_blocks), std::get<4>(one_block)}}) {
      EXPECT_EQ(many.scalar_type(), dtype);
      EXPECT_TRUE(AllClose(many.to(at::kDouble), one.to(at::kDouble), tolerance, tolerance));
    }
  }
}

TEST(GenericBlocks, SelectBackwardInManyBlocksEqualsOneBlockForEverySimilarity) {
  const Case c{3, 40, 30, 5, 4, 5, false, true, MaskKind::AdditivePerSlice, Similarity::Gaussian,
               Rho::Softmax, true};
  const auto in = make_inputs(c, 82);
  for (const auto similarity : kSimilarities) {
    const auto name = convnn::to_string(similarity);
    SCOPED_TRACE(name);
    const auto [scores, indices] = generic::knn_select(in.queries, in.keys, c.k, name, in.optional_mask(), false);
    const auto grad_scores = torch::randn_like(scores);
    const auto one_block = generic::knn_select_backward(grad_scores, in.queries, in.keys, indices, scores, name);
    const BlockBudget tiny(1024);  // every block a single row of a single slice
    const auto many_blocks = generic::knn_select_backward(grad_scores, in.queries, in.keys, indices, scores, name);
    EXPECT_TRUE(AllClose(std::get<0>(many_blocks), std::get<0>(one_block), 1e-14, 1e-14));
    EXPECT_TRUE(AllClose(std::get<1>(many_blocks), std::get<1>(one_block), 1e-14, 1e-14));
    EXPECT_TRUE(std::get<0>(many_blocks).is_contiguous() && std::get<1>(many_blocks).is_contiguous());
  }
}

TEST(GenericBlocks, AggregateBackwardInManyBlocksEqualsOneBlockForBothKernels) {
  torch::manual_seed(83);
  const int64_t g = 3, n = 40, m = 30, c = 5, k = 4;
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  const auto values = torch::randn({g, m, c}, opts), weights = torch::randn({g, n, k}, opts);
  const auto indices = torch::randint(0, m, {g, n, k});
  for (const auto& kernel : {torch::randn({c, k}, opts), torch::randn({c + 2, c, k}, opts)}) {
    const auto dy = torch::randn({g, n, kernel.size(0)}, opts);
    const auto backward = [&] {
      return generic::knn_aggregate_backward(dy, values, weights, indices, kernel, {true, true, true, true});
    };
    const auto one_block = backward();
    const BlockBudget tiny(1024);  // every block a single row of a single slice
    const auto many_blocks = backward();
    EXPECT_TRUE(AllClose(std::get<0>(many_blocks), std::get<0>(one_block), 1e-14, 1e-14));
    EXPECT_TRUE(AllClose(std::get<1>(many_blocks), std::get<1>(one_block), 1e-14, 1e-14));
    EXPECT_TRUE(AllClose(std::get<2>(many_blocks), std::get<2>(one_block), 1e-14, 1e-14));
    EXPECT_TRUE(AllClose(std::get<3>(many_blocks), std::get<3>(one_block), 1e-14, 1e-14));
  }
}

TEST(GenericBlocks, BudgetMustBePositive) {
  EXPECT_THROW(generic::set_block_bytes(0), c10::Error);
  EXPECT_GT(generic::block_bytes(), 0);
}

// Every output of the generic kernels is contiguous, as the Meta kernels declare, whatever the
// inputs' strides: torch.compile checks each output's strides against the Meta kernel's (found on
// an H100, where a transposed input gave the values' gradient the input's strides).
TEST(GenericLayout, EveryOutputIsContiguousAsTheMetaKernelsSayForTransposedInputs) {
  const int64_t g = 2, n = 6, d = 5, k = 3;
  const auto transposed = [&](int64_t rows, int64_t cols) { return torch::randn({g, cols, rows}).transpose(1, 2); };
  const auto x = transposed(n, d);  // [g, n, d] with strides (n*d, 1, n): queries, keys and values
  ASSERT_FALSE(x.is_contiguous());
  const auto expect_contiguous = [](const std::vector<torch::Tensor>& outputs, const char* op) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].defined()) EXPECT_TRUE(outputs[i].is_contiguous()) << op << " output " << i;
    }
  };
  for (const auto& kernel : {torch::randn({d, k}), torch::randn({d + 1, d, k}).transpose(0, 1).contiguous().transpose(0, 1)}) {
    const auto [output, scores, indices, weights] =
        generic::knn_attention(x, x, x, kernel, c10::nullopt, k, "cosine", c10::nullopt, false, "softmax", 1.0);
    expect_contiguous({output, scores, indices, weights}, "knn_attention");
    const auto dy = torch::randn_like(output).transpose(1, 2).contiguous().transpose(1, 2);
    const auto [dq, dk, dv, dkernel, dbias] = generic::knn_attention_backward(
        dy, x, x, x, kernel, scores, indices, weights, "cosine", "softmax", 1.0, {true, true, true, true, false});
    expect_contiguous({dq, dk, dv, dkernel}, "knn_attention_backward");
    const auto [select_scores, select_indices] = generic::knn_select(x, x, k, "dot", c10::nullopt, false);
    expect_contiguous({select_scores, select_indices}, "knn_select");
    const auto [sq, sk] = generic::knn_select_backward(select_scores.transpose(1, 2).contiguous().transpose(1, 2), x,
                                                       x, select_indices, select_scores, "dot");
    expect_contiguous({sq, sk}, "knn_select_backward");
    expect_contiguous({generic::knn_aggregate(x, weights, indices, kernel, c10::nullopt)}, "knn_aggregate");
    const auto [av, aw, ak, ab] = generic::knn_aggregate_backward(dy, x, weights, indices, kernel, {true, true, true, true});
    expect_contiguous({av, aw, ak, ab}, "knn_aggregate_backward");
  }
}

TEST(GenericMeta, ForwardAndBackwardRunOnMetaTensors) {
  const auto meta = torch::TensorOptions().device(torch::kMeta).dtype(torch::kFloat);
  const int64_t g = 2, n = 5, m = 7, d = 3, c = 4, k = 3;
  const auto queries = torch::empty({g, n, d}, meta), keys = torch::empty({g, m, d}, meta);
  const auto values = torch::empty({g, m, c}, meta);
  const auto bool_mask = torch::empty({n, m}, meta.dtype(torch::kBool));
  const auto additive_mask = torch::empty({g, n, m}, meta);
  for (const auto similarity : kSimilarities) {
    for (const auto& mask : {bool_mask, additive_mask}) {
      for (const auto& kernel : {torch::empty({c, k}, meta), torch::empty({c + 1, c, k}, meta)}) {
        const auto name = convnn::to_string(similarity);
        SCOPED_TRACE(std::string(name) + " kernel " + std::to_string(kernel.dim()) + "-D");
        const int64_t c_out = kernel.dim() == 2 ? c : c + 1;
        const auto bias = torch::empty({c_out}, meta);
        auto [scores, indices] = generic::knn_select(queries, keys, k, name, mask, false);
        EXPECT_TRUE(scores.is_meta() && indices.is_meta());
        EXPECT_EQ(indices.sizes(), (std::vector<int64_t>{g, n, k}));
        auto [grad_q, grad_k] = generic::knn_select_backward(scores, queries, keys, indices, scores, name);
        EXPECT_EQ(grad_q.sizes(), queries.sizes());
        EXPECT_EQ(grad_k.sizes(), keys.sizes());
        const auto output = generic::knn_aggregate(values, scores, indices, kernel, bias);
        EXPECT_EQ(output.sizes(), (std::vector<int64_t>{g, n, c_out}));
        auto [dv, dw, dkernel, db] = generic::knn_aggregate_backward(output, values, scores, indices, kernel,
                                                                     {true, true, true, true});
        EXPECT_EQ(dv.sizes(), values.sizes());
        EXPECT_EQ(dkernel.sizes(), kernel.sizes());
        for (const auto& rho : convnn::rho_names()) {
          auto [out, s, i, w] = generic::knn_attention(queries, keys, values, kernel, bias, k, name, mask,
                                                       true, rho, kTemperature);
          EXPECT_TRUE(out.is_meta() && w.is_meta());
          auto grads = generic::knn_attention_backward(out, queries, keys, values, kernel, s, i, w, name,
                                                       rho, kTemperature, {true, true, true, true, true});
          EXPECT_EQ(std::get<1>(grads).defined(), std::string(rho) == "softmax");
          EXPECT_EQ(std::get<2>(grads).sizes(), values.sizes());
        }
      }
    }
  }
}

TEST(GenericErrors, UnrankableScoreRaisesTheFusedOpsMessage) {
  torch::manual_seed(90);
  const auto queries = torch::randn({2, 4, 3}, torch::kDouble), keys = torch::randn({2, 5, 3}, torch::kDouble);
  auto mask = torch::zeros({2, 4, 5}, torch::kDouble);
  mask[1][2][3] = std::numeric_limits<double>::infinity();
  const auto message_of = [](const auto& call) {
    try {
      call();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  BlockBudget one_row_blocks(64);
  const auto generic_message = message_of([&] { generic::knn_select(queries, keys, 2, "dot", mask, false); });
  EXPECT_NE(generic_message.find("[g, i, j] = [1, 2, 3]"), std::string::npos) << generic_message;
  EXPECT_EQ(generic_message, message_of([&] { convnn::ops::knn_select(queries, keys, 2, "dot", mask, false); }));
  EXPECT_EQ(message_of([&] { generic::knn_select(queries, keys, 6, "dot", c10::nullopt, false); }),
            message_of([&] { convnn::ops::knn_select(queries, keys, 6, "dot", c10::nullopt, false); }));
}

// knn_attention's CUDA composition (select -> rho -> aggregate through the dispatcher) equals the
// generic path; on CPU tensors its steps are the fused CPU kernels. A device without kernels of its
// own for the core ops (XPU here; CUDA in a build without the embedded Triton kernels and without
// the Python package) takes the generic path instead of composing.
TEST(CudaComposition, EqualsTheGenericPathForwardAndBackwardAndStandsAsideWithoutDeviceKernels) {
  EXPECT_FALSE(convnn::ops::composite::has_device_kernels(c10::DispatchKey::XPU));
  // The CPU has kernels of its own, unless CONVNN_CPU_KERNELS=generic keeps them unregistered.
  EXPECT_EQ(convnn::ops::composite::has_device_kernels(c10::DispatchKey::CPU), !generic::serves_cpu());
  torch::manual_seed(31);
  const int64_t g = 3, n = 7, m = 9, d = 4, k = 4;
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  const auto queries = torch::randn({g, n, d}, opts), keys = torch::randn({g, m, d}, opts);
  const auto values = torch::randn({g, m, d}, opts);
  const auto mask = torch::rand({n, m}) > 0.3;
  for (const auto& kernel : {torch::randn({d, k}, opts), torch::randn({d + 2, d, k}, opts)}) {
    const auto bias = torch::randn({kernel.size(0)}, opts);
    for (const char* similarity : {"cosine", "l1"}) {
      for (const char* rho : {"softmax", "uniform"}) {
        SCOPED_TRACE(std::string(similarity) + " " + rho + " kernel " + std::to_string(kernel.dim()) + "-D");
        const auto composed = convnn::ops::composite::composed_attention(queries, keys, values, kernel, bias, k,
                                                                    similarity, mask, false, rho, 0.7);
        const auto expected = generic::knn_attention(queries, keys, values, kernel, bias, k, similarity, mask,
                                                     false, rho, 0.7);
        EXPECT_TRUE(torch::equal(std::get<2>(composed), std::get<2>(expected)));
        EXPECT_TRUE(AllClose(std::get<0>(composed), std::get<0>(expected), 1e-12, 1e-12));
        EXPECT_TRUE(AllClose(std::get<3>(composed), std::get<3>(expected), 1e-12, 1e-12));
        const auto dy = torch::randn_like(std::get<0>(expected));
        const auto grads = convnn::ops::composite::composed_attention_backward(
            dy, queries, keys, values, kernel, std::get<1>(expected), std::get<2>(expected),
            std::get<3>(expected), similarity, rho, 0.7, {true, true, true, true, true});
        const auto want = generic::knn_attention_backward(dy, queries, keys, values, kernel, std::get<1>(expected),
                                                          std::get<2>(expected), std::get<3>(expected), similarity,
                                                          rho, 0.7, {true, true, true, true, true});
        const auto same = [](const torch::Tensor& a, const torch::Tensor& b) {
          ASSERT_EQ(a.defined(), b.defined());
          if (a.defined()) EXPECT_TRUE(AllClose(a, b, 1e-12, 1e-12));
        };
        same(std::get<0>(grads), std::get<0>(want));
        same(std::get<1>(grads), std::get<1>(want));
        same(std::get<2>(grads), std::get<2>(want));
        same(std::get<3>(grads), std::get<3>(want));
        same(std::get<4>(grads), std::get<4>(want));
      }
    }
  }
}

TEST(GenericDispatch, EveryBackendWithoutAFusedKernelGetsTheGenericOne) {
  for (const char* op : {"convnn::knn_select", "convnn::knn_select_backward", "convnn::knn_aggregate",
                         "convnn::knn_aggregate_backward", "convnn::knn_attention",
                         "convnn::knn_attention_backward"}) {
    SCOPED_TRACE(op);
    const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(op, "");
    EXPECT_TRUE(handle.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd));
    // The fused kernels serve the CPU unless CONVNN_CPU_KERNELS=generic routes it here.
    EXPECT_EQ(handle.hasKernelForDispatchKey(c10::DispatchKey::CPU), !convnn::ops::generic::serves_cpu());
    EXPECT_TRUE(handle.hasKernelForDispatchKey(c10::DispatchKey::Meta));
    // knn_attention's CUDA kernel composes the core ops' CUDA kernels where they exist and is the
    // generic path where they do not (which core ops have one depends on the build and the Python
    // package: RegisteredDevices.CudaKeyIsFoundInEveryBuildThroughTheAttentionComposition).
    if (std::string(op).find("attention") != std::string::npos) {
      EXPECT_TRUE(handle.hasKernelForDispatchKey(c10::DispatchKey::CUDA));
    }
    EXPECT_TRUE(handle.hasComputedKernelForDispatchKey(c10::DispatchKey::CUDA));
    EXPECT_TRUE(handle.hasComputedKernelForDispatchKey(c10::DispatchKey::MPS));
  }
}

TEST(GenericDispatch, AutocastCoversEveryDeviceTheGenericPathServesByAtensOwnKeys) {
  for (const char* op : {"convnn::knn_select", "convnn::knn_aggregate", "convnn::knn_attention"}) {
    SCOPED_TRACE(op);
    const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(op, "");
    for (const auto device : {c10::DeviceType::CPU, c10::DeviceType::CUDA, c10::DeviceType::XPU, c10::DeviceType::MPS}) {
      EXPECT_TRUE(handle.hasKernelForDispatchKey(at::autocast::get_autocast_dispatch_key_from_device_type(device)))
          << device;
    }
  }
}

// Value checks would stall the host on an accelerator (src/ops/checks.h): they read CPU tensors
// only, and meta tensors, which have no values, never.
TEST(GenericChecks, ValuesAreReadOnCpuTensorsAndNeverOnMetaTensors) {
  EXPECT_TRUE(convnn::checks::reads_values_of(torch::zeros({2})));
  EXPECT_FALSE(convnn::checks::reads_values_of(torch::zeros({2}, torch::device(torch::kMeta))));
  // A meta call with indices that would be out of range on the CPU passes: nothing is read.
  const auto values = torch::zeros({1, 3, 2}, torch::device(torch::kMeta));
  const auto weights = torch::zeros({1, 2, 2}, torch::device(torch::kMeta));
  const auto indices = torch::empty({1, 2, 2}, torch::device(torch::kMeta).dtype(torch::kLong));
  const auto kernel = torch::zeros({2, 2}, torch::device(torch::kMeta));
  EXPECT_EQ(convnn::ops::generic::knn_aggregate(values, weights, indices, kernel, c10::nullopt).sizes(),
            (std::vector<int64_t>{1, 2, 2}));
}

// The generic path on a CUDA device against the same path on the CPU, over the attention sweep
// (every similarity x rho x kernel kind, the masks, K and slot orders): the same indices, outputs
// and every gradient to 1e-12 in float64, and two backward passes on the device bitwise equal.
// Each case shows as skipped where there is no CUDA device.
class GenericCuda : public ::testing::TestWithParam<Case> {};

Inputs to_cuda(const Inputs& in) {
  Inputs on_cuda = in;
  for (auto* t : {&on_cuda.queries, &on_cuda.keys, &on_cuda.values, &on_cuda.kernel, &on_cuda.bias, &on_cuda.mask}) {
    if (t->defined()) *t = t->to(torch::kCUDA);
  }
  return on_cuda;
}

TEST_P(GenericCuda, SelectAggregateAndAttentionEqualTheCpuAndBackwardIsBitwiseRepeatable) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Case& c = GetParam();
  const auto in = make_inputs(c, 100);
  const auto on_cuda = to_cuda(in);
  const auto [scores, indices] = generic::knn_select(in.queries, in.keys, c.k, convnn::to_string(c.similarity),
                                                     in.optional_mask(), c.index_order);
  const auto [cuda_scores, cuda_indices] = convnn::ops::knn_select(
      on_cuda.queries, on_cuda.keys, c.k, convnn::to_string(c.similarity), on_cuda.optional_mask(), c.index_order);
  EXPECT_TRUE(torch::equal(cuda_indices.cpu(), indices)) << c.name();
  EXPECT_TRUE(AllClose(cuda_scores.cpu(), scores, 1e-12, 1e-12)) << c.name();

  const auto [output, attention_scores, attention_indices, weights] = generic_attention(c, in);
  const auto [cuda_output, cuda_attention_scores, cuda_attention_indices, cuda_weights] =
      fused_attention(c, on_cuda);
  EXPECT_TRUE(torch::equal(cuda_attention_indices.cpu(), attention_indices)) << c.name();
  EXPECT_TRUE(AllClose(cuda_output.cpu(), output, 1e-12, 1e-12)) << c.name();
  EXPECT_TRUE(AllClose(convnn::ops::knn_aggregate(on_cuda.values, cuda_weights, cuda_attention_indices,
                                                  on_cuda.kernel, on_cuda.optional_bias()).cpu(),
                       output, 1e-12, 1e-12)) << c.name();

  const auto grad_output = torch::randn_like(output);
  const auto backward = [&](const Inputs& x, const torch::Tensor& dy, const AttentionResult& forward) {
    return convnn::ops::knn_attention_backward(dy, x.queries, x.keys, x.values, x.kernel, std::get<1>(forward),
                                               std::get<2>(forward), std::get<3>(forward),
                                               convnn::to_string(c.similarity), convnn::to_string(c.rho),
                                               kTemperature, {true, true, true, true, c.bias});
  };
  const AttentionResult cpu_forward{output, attention_scores, attention_indices, weights};
  const AttentionResult cuda_forward{cuda_output, cuda_attention_scores, cuda_attention_indices, cuda_weights};
  const auto cpu_grads = backward(in, grad_output, cpu_forward);
  const auto cuda_grads = backward(on_cuda, grad_output.cuda(), cuda_forward);
  const auto cuda_again = backward(on_cuda, grad_output.cuda(), cuda_forward);
  const auto same = [&](const torch::Tensor& cuda, const torch::Tensor& again, const torch::Tensor& cpu) {
    ASSERT_EQ(cuda.defined(), cpu.defined()) << c.name();
    if (!cpu.defined()) return;
    EXPECT_TRUE(AllClose(cuda.cpu(), cpu, 1e-12, 1e-12)) << c.name();
    EXPECT_TRUE(torch::equal(cuda, again)) << c.name();
  };
  same(std::get<0>(cuda_grads), std::get<0>(cuda_again), std::get<0>(cpu_grads));
  same(std::get<1>(cuda_grads), std::get<1>(cuda_again), std::get<1>(cpu_grads));
  same(std::get<2>(cuda_grads), std::get<2>(cuda_again), std::get<2>(cpu_grads));
  same(std::get<3>(cuda_grads), std::get<3>(cuda_again), std::get<3>(cpu_grads));
  same(std::get<4>(cuda_grads), std::get<4>(cuda_again), std::get<4>(cpu_grads));
}

INSTANTIATE_TEST_SUITE_P(AttentionSweep, GenericCuda, ::testing::ValuesIn(attention_sweep()));

}  // namespace

}  // namespace generic_test
