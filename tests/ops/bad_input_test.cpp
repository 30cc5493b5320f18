// Every public entry point rejects bad input with a c10::Error whose message names the argument,
// its value and the rule; none of them crashes the process.
#include <c10/util/StringUtil.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>

#include "convnn/nn/functional/convnn.h"
#include "convnn/nn/modules/convnn.h"
#include "convnn/ops/knn_ops.h"
#include "convnn/ops/similarity.h"
#include "ops/checks.h"

namespace {

using namespace convnn::nn;
using convnn::nn::functional::ConvNNFuncOptions;
namespace F = convnn::nn::functional;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// `run` must throw a c10::Error whose message (without backtrace) contains every fragment.
template <typename Run>
::testing::AssertionResult ThrowsWith(Run&& run, std::initializer_list<std::string> fragments) {
  try {
    run();
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    for (const auto& fragment : fragments) {
      if (message.find(fragment) == std::string::npos) {
        return ::testing::AssertionFailure()
               << "message\n  " << message << "\nlacks\n  " << fragment;
      }
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-c10 exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

#define EXPECT_ERROR(statement, ...) \
  EXPECT_TRUE(ThrowsWith([&] { (void)(statement); }, {__VA_ARGS__}))

at::Tensor randn(c10::IntArrayRef shape, at::ScalarType dtype = at::kDouble) {
  return at::randn(shape, at::TensorOptions().dtype(dtype));
}

// The similarities an error lists, from the library's name table (a new one joins the list).
std::string allowed_similarities() { return c10::Join(", ", convnn::similarity_names()); }

// ------------------------------------------------------------------------------ knn_select

class KnnSelectBadInput : public ::testing::Test {
 protected:
  at::Tensor q = randn({2, 4, 3}), k = randn({2, 5, 3});

  auto select(const at::Tensor& queries, const at::Tensor& keys, int64_t top = 2,
              const std::string& similarity = "dot",
              const c10::optional<at::Tensor>& mask = c10::nullopt) {
    return convnn::ops::knn_select(queries, keys, top, similarity, mask, false);
  }
};

TEST_F(KnnSelectBadInput, WrongRankNamesTheArgumentLayoutAndShape) {
  EXPECT_ERROR(select(q[0], k), "knn_select: queries must be 3-D [G,N,D], got shape [4, 3]");
  EXPECT_ERROR(select(q, k.unsqueeze(0)),
               "knn_select: keys must be 3-D [G,M,D], got shape [1, 2, 5, 3]");
  EXPECT_ERROR(select(at::Tensor(), k), "knn_select: queries must be a defined tensor");
  EXPECT_ERROR(select(q, at::Tensor()), "knn_select: keys must be a defined tensor");
}

TEST_F(KnnSelectBadInput, MismatchedGAndDAreNamedWithBothShapes) {
  EXPECT_ERROR(select(q, randn({3, 5, 3})), "same G (dim 0)", "[2, 4, 3]", "[3, 5, 3]");
  EXPECT_ERROR(select(q, randn({2, 5, 2})), "same feature size D (dim 2)", "[2, 5, 2]");
  EXPECT_ERROR(select(randn({2, 4, 0}), randn({2, 5, 0})), "feature size D must be at least 1");
}

TEST_F(KnnSelectBadInput, KOutsideOneToMNamesKAndM) {
  EXPECT_ERROR(select(q, k, 0), "k must be in [1, M] where M = 5", "got k = 0");
  EXPECT_ERROR(select(q, k, -3), "got k = -3");
  EXPECT_ERROR(select(q, k, 6), "k must be in [1, M] where M = 5", "got k = 6");
  EXPECT_ERROR(select(q, randn({2, 0, 3}), 1), "M = 0", "got k = 1");
}

TEST_F(KnnSelectBadInput, DtypesMustBeFloatingAndEqual) {
  EXPECT_ERROR(select(q.to(at::kLong), k.to(at::kLong)), "queries must be a floating-point tensor",
               "Long");
  EXPECT_ERROR(select(q, k.to(at::kFloat)),
               "queries and keys must have the same dtype, got Double and Float");
}

TEST_F(KnnSelectBadInput, UnknownSimilarityListsTheAllowedNames) {
  EXPECT_ERROR(select(q, k, 2, "euclidean"), "similarity must be one of " + allowed_similarities() + "; got 'euclidean'");
  EXPECT_ERROR(select(q, k, 2, ""), "got ''");
}

TEST_F(KnnSelectBadInput, MaskOfWrongRankShapeOrDtype) {
  EXPECT_ERROR(select(q, k, 2, "dot", at::ones({5}, at::kBool)),
               "mask must be 2-D [N,M] or 3-D [G,N,M], got shape [5]");
  EXPECT_ERROR(select(q, k, 2, "dot", at::ones({4, 4}, at::kBool)),
               "mask shape [4, 4] does not match [N,M] = [4, 5] or [G',N,M] = [G', 4, 5] with G' dividing G = 2");
  EXPECT_ERROR(select(q, k, 2, "dot", at::ones({3, 4, 5}, at::kBool)), "mask shape [3, 4, 5]");
  EXPECT_ERROR(select(q, k, 2, "dot", at::ones({2, 4, 4}, at::kBool)), "mask shape [2, 4, 4]");
  EXPECT_ERROR(select(q, k, 2, "dot", at::ones({4, 5}, at::kLong)),
               "mask must be bool (true = may be selected) or floating-point (additive), got Long");
}

TEST_F(KnnSelectBadInput, DistanceSimilaritiesRejectAdditiveMasksOtherThanZeroAndMinusInf) {
  auto mask = at::zeros({4, 5}, at::kDouble);
  mask[1][2] = -0.5;
  // Every distance similarity of the library's list (similarity_names()).
  for (const auto& similarity : convnn::similarity_names()) {
    if (!convnn::is_distance_similarity(convnn::parse_similarity(similarity))) continue;
    EXPECT_ERROR(select(q, k, 2, similarity, mask), "additive mask with similarity '", similarity,
                 "must hold only 0 and -inf");
  }
}

TEST_F(KnnSelectBadInput, NanOrInfInputsNameTheArgumentAndPosition) {
  for (const double bad : {kNaN, kInf, -kInf}) {
    auto bad_keys = k.clone();
    bad_keys[1][3][2] = bad;
    auto bad_queries = q.clone();
    bad_queries[0][2][1] = bad;
    for (const auto& similarity : convnn::similarity_names()) {
      EXPECT_ERROR(select(q, bad_keys, 2, similarity), "knn_select: keys must be finite",
                   "at position [1, 3, 2]");
      EXPECT_ERROR(select(bad_queries, k, 2, similarity), "knn_select: queries must be finite",
                   "at position [0, 2, 1]");
    }
  }
}

// Proves the message names the first offending element in row-major order, with its own value,
// when several are bad (at::nonzero's rows are not contiguous: reading one through its data
// pointer used to report position [0, 0, 0] and a finite value there).
TEST_F(KnnSelectBadInput, SeveralNonFiniteInputsNameTheFirstOneAndItsValue) {
  auto bad_queries = q.clone();
  bad_queries[0][2][1] = kInf;
  bad_queries[0][3][0] = kNaN;
  bad_queries[1][0][2] = -kInf;
  EXPECT_ERROR(select(bad_queries, k, 2, "dot"), "knn_select: queries must be finite",
               "found inf at position [0, 2, 1]");
}

TEST_F(KnnSelectBadInput, PlusInfMaskEntryNamesItsScorePosition) {
  auto mask = at::zeros({4, 5}, at::kDouble);
  mask[2][1] = kInf;
  EXPECT_ERROR(select(q, k, 2, "dot", mask), "[g, i, j] = [0, 2, 1]");
}

TEST_F(KnnSelectBadInput, DeviceMismatchIsNamed) {
  // No second real device here: a meta tensor stands in. Through the dispatcher the meta key picks
  // the Meta kernel, which runs the shared checks; they are also called directly.
  const auto meta_keys =
      at::empty({2, 5, 3}, at::TensorOptions().dtype(at::kDouble).device(at::kMeta));
  EXPECT_ERROR(select(q, meta_keys), "knn_select: queries and keys must be on the same device, got cpu and meta");
  EXPECT_ERROR(convnn::checks::check_select_inputs(q, meta_keys, 2, "dot", c10::nullopt),
               "queries and keys must be on the same device, got cpu and meta");
  const auto meta_mask = at::empty({4, 5}, at::TensorOptions().dtype(at::kBool).device(at::kMeta));
  EXPECT_ERROR(convnn::checks::check_select_inputs(q, k, 2, "dot", meta_mask),
               "mask and queries must be on the same device, got meta and cpu");
}

TEST_F(KnnSelectBadInput, BackwardOpRejectsMismatchedShapes) {
  at::Tensor scores, indices;
  std::tie(scores, indices) = select(q, k);
  EXPECT_ERROR(
      convnn::ops::knn_select_backward(scores.narrow(-1, 0, 1), q, k, indices, scores, "dot"),
      "knn_select_backward: grad_scores must have the shape of indices [2, 4, 2], got [2, 4, 1]");
  EXPECT_ERROR(convnn::ops::knn_select_backward(scores, q, k, indices + 5, scores, "dot"),
               "knn_select_backward: indices must lie in [0, M) with M = 5");
}

// ------------------------------------------------------------------------------ knn_aggregate

class KnnAggregateBadInput : public ::testing::Test {
 protected:
  at::Tensor values = randn({2, 6, 3}), weights = randn({2, 4, 2});
  at::Tensor indices = at::randint(6, {2, 4, 2}, at::kLong);
  at::Tensor kernel = randn({5, 3, 2}), bias = randn({5});

  at::Tensor aggregate(const at::Tensor& v, const at::Tensor& w, const at::Tensor& i,
                       const at::Tensor& kern, const c10::optional<at::Tensor>& b = c10::nullopt) {
    return convnn::ops::knn_aggregate(v, w, i, kern, b);
  }
};

TEST_F(KnnAggregateBadInput, WrongRankNamesTheArgumentLayoutAndShape) {
  EXPECT_ERROR(aggregate(values[0], weights, indices, kernel),
               "values must be 3-D [G,M,C], got shape [6, 3]");
  EXPECT_ERROR(aggregate(values, weights[0], indices, kernel),
               "weights must be 3-D [G,N,K], got shape [4, 2]");
  EXPECT_ERROR(aggregate(values, weights, indices[0], kernel),
               "indices must be 3-D [G,N,K], got shape [4, 2]");
  EXPECT_ERROR(aggregate(values, weights, indices, randn({2})),
               "kernel must be 2-D [C,K] (depthwise) or 3-D [C',C,K] (standard), got shape [2]");
  EXPECT_ERROR(aggregate(values, weights, indices, at::Tensor()),
               "knn_aggregate: kernel must be a defined tensor");
  EXPECT_ERROR(aggregate(values, at::Tensor(), indices, kernel),
               "knn_aggregate: weights must be a defined tensor");
}

TEST_F(KnnAggregateBadInput, ShapeMismatchesNameBothShapes) {
  EXPECT_ERROR(aggregate(values, weights, indices.narrow(1, 0, 3), kernel),
               "weights and indices must have the same shape [G,N,K], got weights [2, 4, 2] and "
               "indices [2, 3, 2]");
  EXPECT_ERROR(aggregate(randn({3, 6, 3}), weights, indices, kernel),
               "values and weights must have the same G (dim 0), got values [3, 6, 3] and weights "
               "[2, 4, 2]");
  EXPECT_ERROR(aggregate(values, weights, indices, randn({5, 4, 2})),
               "kernel shape [5, 4, 2] does not match C = 3 (values.size(2)) and K = 2");
  EXPECT_ERROR(aggregate(values, weights, indices, randn({3, 3})),
               "kernel shape [3, 3] does not match");
  EXPECT_ERROR(aggregate(values, weights, indices, kernel, randn({4})),
               "bias must be 1-D [C'] = [5], got shape [4]");
  EXPECT_ERROR(aggregate(values, weights, indices, randn({3, 2}), randn({5})),
               "bias must be 1-D [C'] = [3]");
}

TEST_F(KnnAggregateBadInput, KMustBeAtLeastOne) {
  EXPECT_ERROR(aggregate(values, randn({2, 4, 0}), at::zeros({2, 4, 0}, at::kLong), randn({3, 0})),
               "the neighbour count K (weights.size(2)) must be at least 1, got 0");
}

TEST_F(KnnAggregateBadInput, IndicesOutOfRangeNameTheValueAndPosition) {
  auto too_large = indices.clone();
  too_large[1][2][0] = 6;
  EXPECT_ERROR(aggregate(values, weights, too_large, kernel),
               "indices must lie in [0, M) with M = 6", "found 6 at position [1, 2, 0]");
  auto negative = indices.clone();
  negative[0][3][1] = -1;
  EXPECT_ERROR(aggregate(values, weights, negative, kernel), "found -1 at position [0, 3, 1]");
  // Several: the first in row-major order, with its own value.
  auto several = indices.clone();
  several[0][2][1] = 7;
  several[1][0][0] = -3;
  several[1][3][1] = 9;
  EXPECT_ERROR(aggregate(values, weights, several, kernel), "found 7 at position [0, 2, 1]");
}

TEST_F(KnnAggregateBadInput, DtypeMismatchesAreNamed) {
  EXPECT_ERROR(
      aggregate(values.to(at::kLong), weights.to(at::kLong), indices, kernel.to(at::kLong)),
      "values must be a floating-point tensor", "Long");
  EXPECT_ERROR(aggregate(values, weights.to(at::kFloat), indices, kernel),
               "values and weights must have the same dtype, got Double and Float");
  EXPECT_ERROR(aggregate(values, weights, indices, kernel.to(at::kFloat)),
               "values and kernel must have the same dtype, got Double and Float");
  EXPECT_ERROR(aggregate(values, weights, indices, kernel, bias.to(at::kFloat)),
               "values and bias must have the same dtype, got Double and Float");
  EXPECT_ERROR(aggregate(values, weights, indices.to(at::kInt), kernel),
               "indices must be int64, got Int");
}

TEST_F(KnnAggregateBadInput, DeviceMismatchIsNamed) {
  // See KnnSelectBadInput.DeviceMismatchIsNamed: the shared check is called directly.
  const auto meta = at::TensorOptions().device(at::kMeta);
  EXPECT_THROW(aggregate(values, weights, indices, at::empty({5, 3, 2}, meta.dtype(at::kDouble))),
               c10::Error);
  EXPECT_ERROR(
      convnn::checks::check_aggregate_inputs(
          values, weights, indices, at::empty({5, 3, 2}, meta.dtype(at::kDouble)), c10::nullopt),
      "values and kernel must be on the same device, got cpu and meta");
  EXPECT_ERROR(
      convnn::checks::check_aggregate_inputs(
          values, weights, at::empty({2, 4, 2}, meta.dtype(at::kLong)), kernel, c10::nullopt),
      "values and indices must be on the same device, got cpu and meta");
}

TEST_F(KnnAggregateBadInput, BackwardOpRejectsAWrongGradShape) {
  EXPECT_ERROR(
      convnn::ops::knn_aggregate_backward(randn({2, 4, 4}), values, weights, indices, kernel,
                                          {true, true, true, false}),
      "knn_aggregate_backward: grad_output must have shape [G,N,C'] = [2, 4, 5], got [2, 4, 4]");
}

// ------------------------------------------------------------------------------ conv_nn

class ConvNNBadInput : public ::testing::Test {
 protected:
  at::Tensor x = randn({2, 6, 4}), kernel = randn({4, 3});

  at::Tensor run(const ConvNNFuncOptions& o, const at::Tensor& coordinates = {}) {
    return F::conv_nn(x, x, x, kernel, {}, o, coordinates);
  }
};

TEST_F(ConvNNBadInput, WrongRankOrMismatchedTokens) {
  EXPECT_ERROR(F::conv_nn(x[0], x, x, kernel, {}, 3),
               "conv_nn: queries must be 3-D [B,N,D], got [6, 4]");
  EXPECT_ERROR(F::conv_nn(x, x[0], x, kernel, {}, 3),
               "conv_nn: keys must be 3-D [B,M,D], got [6, 4]");
  EXPECT_ERROR(F::conv_nn(x, x, at::Tensor(), kernel, {}, 3),
               "values must be 3-D [B,M,C], got undefined");
  EXPECT_ERROR(F::conv_nn(x, x, randn({2, 5, 4}), kernel, {}, 3),
               "keys [2, 6, 4] and values [2, 5, 4] must have the same B and M");
  EXPECT_ERROR(F::conv_nn(randn({3, 6, 4}), x, x, kernel, {}, 3),
               "queries [3, 6, 4] and keys [2, 6, 4] must have the same batch size B");
}

TEST_F(ConvNNBadInput, KOutsideTheCandidateCount) {
  EXPECT_ERROR(run(ConvNNFuncOptions(0)),
               "k must be in [1, 6] (the number of candidates, M), got k = 0");
  EXPECT_ERROR(run(ConvNNFuncOptions(7)), "k must be in [1, 6]", "got k = 7");
  EXPECT_ERROR(run(ConvNNFuncOptions(4).num_candidates(3)),
               "k must be in [1, 3] (the number of candidates, r), got k = 4");
}

TEST_F(ConvNNBadInput, NumCandidatesOutsideZeroToM) {
  EXPECT_ERROR(run(ConvNNFuncOptions(3).num_candidates(7)),
               "num_candidates (r) must be in [0, M] with M = 6 candidates (0 = all), got r = 7");
  EXPECT_ERROR(run(ConvNNFuncOptions(3).num_candidates(-1)), "got r = -1");
}

TEST_F(ConvNNBadInput, HeadsMustDivideTheChannels) {
  EXPECT_ERROR(run(ConvNNFuncOptions(3).heads(3)),
               "heads = 3 must divide the query channels (4) and value channels (4)");
  EXPECT_ERROR(run(ConvNNFuncOptions(3).heads(0)), "heads must be at least 1, got 0");
}

TEST_F(ConvNNBadInput, AlphaOutsideZeroToOneOrWithoutCoordinates) {
  const auto coordinates = F::grid_coordinates({6}, x.options());
  for (const double alpha : {-0.1, 1.5, kNaN}) {
    EXPECT_ERROR(run(ConvNNFuncOptions(3).alpha(alpha), coordinates),
                 "alpha must be in [0, 1], got ");
  }
  EXPECT_ERROR(
      run(ConvNNFuncOptions(3).alpha(0.5)),
      "alpha = 0.5 blends feature and positional similarity, but no coordinates were given");
}

TEST_F(ConvNNBadInput, TemperatureMustBePositiveAndFinite) {
  for (const double temperature : {0.0, -1.0, kInf, kNaN}) {
    EXPECT_ERROR(run(ConvNNFuncOptions(3).rho(Rho::Softmax).temperature(temperature)),
                 "temperature must be finite and at least 1.17549e-38");
  }
}

TEST_F(ConvNNBadInput, IncludeSelfNeedsQueriesAndKeysFromTheSameTokens) {
  EXPECT_ERROR(
      F::conv_nn(randn({2, 5, 4}), x, x, kernel, {},
                 ConvNNFuncOptions(3).num_candidates(4).include_self(true)),
      "include_self needs queries and keys from the same tokens (N == M), got N = 5 and M = 6");
}

TEST_F(ConvNNBadInput, PaddingAndCoordinatesOfTheWrongShape) {
  EXPECT_ERROR(run(ConvNNFuncOptions(3).padding(1)),
               "padding = 1 applies to spatial inputs only (conv_nn1d / conv_nn2d / conv_nn3d)");
  EXPECT_ERROR(run(ConvNNFuncOptions(3).dilation({2})),
               "stride = [1] and dilation = [2] apply to spatial inputs only (conv_nn1d / conv_nn2d / conv_nn3d)");
  EXPECT_ERROR(run(ConvNNFuncOptions(3).alpha(0.5), at::zeros({5, 2}, at::kDouble)),
               "coordinates must be [N,P] with N = M = 6, got [5, 2]");
}

TEST_F(ConvNNBadInput, KernelAndBiasOfTheWrongShape) {
  EXPECT_ERROR(F::conv_nn(x, x, x, randn({3}), {}, 3),
               "kernel must be [dv,K] or [dv',dv,K], got [3]");
  EXPECT_ERROR(F::conv_nn(x, x, x, at::Tensor(), {}, 3), "got undefined");
  EXPECT_ERROR(F::conv_nn(x, x, x, randn({3, 2, 3}), {},
                          ConvNNFuncOptions(3).heads(2).kernel_per_head(true)),
               "kernel_per_head needs kernel.size(0) == heads = 2, got kernel [3, 2, 3]");
  EXPECT_ERROR(F::conv_nn(x, x, x, randn({4, 2}), {}, 3), "kernel shape [4, 2] does not match",
               "K = 3");
  EXPECT_ERROR(F::conv_nn(x, x, x, kernel, randn({4, 1}), 3), "bias must be [dv'], got [4, 1]");
}

TEST_F(ConvNNBadInput, MaskOfTheWrongShape) {
  const auto mask = at::ones({6, 5}, at::kBool);
  const auto* expected =
      "conv_nn: mask must be [N,M] = [6, 6], [B,N,M] = [2, 6, 6] (per sample) or [B*heads,N,M] = [4, 6, 6], got "
      "shape [6, 5]";
  EXPECT_ERROR(run(ConvNNFuncOptions(3).heads(2).mask(mask)), expected);
  // Random candidates slice the mask before knn_select could check it.
  EXPECT_ERROR(run(ConvNNFuncOptions(3).heads(2).mask(mask).num_candidates(4)), expected);
  EXPECT_ERROR(run(ConvNNFuncOptions(3).mask(at::ones({3, 6, 6}, at::kBool)).heads(2)),
               "got shape [3, 6, 6]");
}

TEST_F(ConvNNBadInput, DtypeMismatchBetweenQueriesAndKeys) {
  EXPECT_ERROR(F::conv_nn(x, x.to(at::kFloat), x.to(at::kFloat), kernel, {}, 3),
               "queries and keys must have the same dtype, got Double and Float");
}

TEST(SpatialConvNNBadInput, InputRankPaddingAndAlpha) {
  const auto kernel = randn({4, 4, 3});
  EXPECT_ERROR(F::conv_nn1d(randn({2, 4}), kernel, {}, 3),
               "conv_nn1d: input must be 3-D [B,C,L], got [2, 4]");
  EXPECT_ERROR(F::conv_nn2d(randn({2, 4, 5}), kernel, {}, 3),
               "conv_nn2d: input must be 4-D [B,C,H,W], got [2, 4, 5]");
  EXPECT_ERROR(F::conv_nn1d(randn({2, 4, 5}), kernel, {}, ConvNNFuncOptions(3).padding(-1)),
               "conv_nn1d: padding must be non-negative, got -1");
  EXPECT_ERROR(
      F::conv_nn2d(randn({2, 4, 3, 3}), kernel, {}, ConvNNFuncOptions(3).alpha(0.5)),
      "conv_nn2d: alpha = 0.5 blends in positional similarity, which needs coordinates(true)");
  EXPECT_ERROR(F::conv_nn1d(randn({2, 4, 2}), kernel, {}, 3), "k must be in [1, 2]", "got k = 3");
  EXPECT_ERROR(F::conv_nn3d(randn({2, 4, 5, 5}), kernel, {}, 3),
               "conv_nn3d: input must be 5-D [B,C,D,H,W], got [2, 4, 5, 5]");
  EXPECT_ERROR(F::conv_nn2d(randn({2, 4, 5, 5}), kernel, {}, ConvNNFuncOptions(3).stride({0})),
               "conv_nn2d: stride must be at least 1 on every axis, got [0]");
  EXPECT_ERROR(F::conv_nn3d(randn({2, 4, 5, 5, 5}), kernel, {}, ConvNNFuncOptions(3).dilation({1, 2})),
               "conv_nn3d: dilation must be one value or 3 (one per axis), got [1, 2]");
  EXPECT_ERROR(F::conv_nn1d(randn({2, 4, 6}), kernel, {},
                            ConvNNFuncOptions(3).stride({2}).mask(at::ones({6, 6}, at::kBool))),
               "conv_nn1d: a mask is not supported with stride [2] or dilation [1]");
}

// ------------------------------------------------------------------------------ helpers

TEST(FunctionalHelpersBadInput, RhoWeightsRejectsBadTemperatureAndNonFloatingScores) {
  const auto scores = randn({2, 3, 4});
  for (const double temperature : {0.0, -2.0, kNaN}) {
    EXPECT_ERROR(F::rho_weights(scores, Rho::Softmax, temperature),
                 "rho_weights: temperature must be finite and at least 1.17549e-38");
  }
  EXPECT_ERROR(F::rho_weights(at::zeros({2, 3}, at::kLong), Rho::Uniform),
               "rho_weights: scores must be a floating-point tensor, got Long");
  EXPECT_ERROR(F::rho_weights(at::Tensor(), Rho::Mean),
               "rho_weights: scores must be a defined tensor");
}

TEST(FunctionalHelpersBadInput, MasksRejectNegativeSizesAndOutOfRangeCounts) {
  EXPECT_ERROR(F::causal_mask(-1), "causal_mask: n must be non-negative, got -1");
  EXPECT_ERROR(F::bigbird_mask(-2, 1, 0, 0), "bigbird_mask: n must be non-negative, got -2");
  EXPECT_ERROR(F::bigbird_mask(8, -1, 0, 0), "bigbird_mask: window must be non-negative, got -1");
  EXPECT_ERROR(F::bigbird_mask(8, 1, 9, 0),
               "bigbird_mask: num_global must be in [0, n = 8], got 9");
  EXPECT_ERROR(F::bigbird_mask(8, 1, 0, 9),
               "bigbird_mask: num_random must be in [0, n = 8], got 9");
  EXPECT_ERROR(F::strided_mask(8, 0), "strided_mask: stride must be at least 1, got 0");
  EXPECT_ERROR(F::strided_mask(-1, 2), "strided_mask: n must be non-negative, got -1");
}

TEST(FunctionalHelpersBadInput, GridCoordinatesAndDrawCandidates) {
  const auto options = at::TensorOptions().dtype(at::kDouble);
  EXPECT_ERROR(F::grid_coordinates({}, options), "grid_coordinates: sizes must not be empty");
  EXPECT_ERROR(F::grid_coordinates({3, 0}, options),
               "grid_coordinates: every size must be at least 1, got [3, 0]");
  EXPECT_ERROR(F::draw_candidates(5, 6, c10::nullopt, at::kCPU),
               "draw_candidates: r must be in [1, m] with m = 5, got r = 6");
  EXPECT_ERROR(F::draw_candidates(5, 0, c10::nullopt, at::kCPU), "got r = 0");
}

TEST(FunctionalHelpersBadInput, UnknownOptionNamesListTheAllowedValues) {
  EXPECT_ERROR(convnn::parse_similarity("l2"), "similarity must be one of " + allowed_similarities() + "; got 'l2'");
  EXPECT_ERROR(parse_rho("max"), "rho must be one of uniform, mean, softmax; got 'max'");
  EXPECT_ERROR(parse_slot_order("random"), "slot_order must be one of score, index; got 'random'");
  EXPECT_ERROR(parse_aggregation("grouped"),
               "aggregation must be one of standard, depthwise; got 'grouped'");
  EXPECT_ERROR(parse_eval_candidates("none"),
               "eval_candidates must be one of fixed, fresh; got 'none'");
  EXPECT_ERROR(parse_kernel_init("zeros"), "kernel_init must be one of default, ones; got 'zeros'");
  EXPECT_ERROR(parse_projection("mlp"), "projection must be one of identity, linear; got 'mlp'");
}

// ------------------------------------------------------------------------------ modules

TEST(ConvNNLayerBadInput, ConstructorsRejectInvalidOptions) {
  EXPECT_ERROR(ConvNN2d(ConvNN2dOptions(0, 4, 3)),
               "ConvNN2d: in_channels must be at least 1, got 0");
  EXPECT_ERROR(ConvNN2d(ConvNN2dOptions(4, 0, 3)),
               "ConvNN2d: out_channels must be at least 1, got 0");
  EXPECT_ERROR(ConvNN1d(ConvNN1dOptions(4, 4, 0)), "ConvNN1d: k must be at least 1, got 0");
  EXPECT_ERROR(
      ConvNN2d(ConvNN2dOptions(4, 6, 3).heads(4)),
      "ConvNN2d: heads = 4 must be at least 1 and divide in_channels (4) and out_channels (6)");
  EXPECT_ERROR(ConvNN2d(ConvNN2dOptions(4, 8, 3).aggregation(Aggregation::Depthwise)),
               "depthwise aggregation keeps the channel count, so out_channels (8) must equal "
               "in_channels (4)");
  EXPECT_ERROR(ConvNN1d(ConvNN1dOptions(4, 4, 3).padding(-1)),
               "ConvNN1d: padding must be non-negative, got -1");
  EXPECT_ERROR(ConvNN2d(ConvNN2dOptions(4, 4, 3).coordinates(true).alpha(1.5)),
               "ConvNN2d: alpha must be in [0, 1], got 1.5");
  EXPECT_ERROR(ConvNN2d(ConvNN2dOptions(4, 4, 3).alpha(0.5)),
               "alpha = 0.5 blends in positional similarity, which needs coordinates(true)");
  EXPECT_ERROR(ConvNN2d(ConvNN2dOptions(4, 4, 3).num_candidates(-2)),
               "num_candidates must be non-negative (0 = all), got -2");
  EXPECT_ERROR(ConvNN2d(ConvNN2dOptions(4, 4, 3).temperature(0.0)),
               "ConvNN2d: temperature must be finite and at least 1.17549e-38 (the smallest normal float32, in which softmax accumulates), got 0");
  EXPECT_ERROR(ConvNN2d(ConvNN2dOptions(4, 4, 3).temperature(kNaN)),
               "ConvNN2d: temperature must be finite and at least");
  EXPECT_ERROR(ConvNN2d(ConvNN2dOptions(4, 4, 3).qk_channels(8)),
               "qk_channels needs projection = linear");
  EXPECT_ERROR(
      ConvNN2d(ConvNN2dOptions(4, 4, 3).heads(2).projection(Projection::Linear).qk_channels(3)),
      "qk_channels = 3 must be divisible by heads = 2");
}

TEST(ConvNNLayerBadInput, ForwardRejectsWrongRankChannelsAndSizes) {
  ConvNN1d conv1d(ConvNN1dOptions(4, 4, 3));
  EXPECT_ERROR(conv1d(randn({5}, at::kFloat)),
               "ConvNN1d: input must be 3-D [B,C,L] (or 2-D [C,L] for one sample), got [5]");
  EXPECT_ERROR(conv1d(randn({2, 3, 5}, at::kFloat)),
               "ConvNN1d: input has 3 channels (dim 1), but in_channels = 4");
  EXPECT_ERROR(conv1d(randn({2, 4, 2}, at::kFloat)), "k must be in [1, 2]", "got k = 3");
  ConvNN2d conv2d(ConvNN2dOptions(4, 4, 3).num_candidates(10));
  EXPECT_ERROR(conv2d(randn({4, 5}, at::kFloat)),
               "ConvNN2d: input must be 4-D [B,C,H,W] (or 3-D [C,H,W] for one sample), got [4, 5]");
  EXPECT_ERROR(conv2d(randn({1, 4, 3, 3}, at::kFloat)),
               "num_candidates (r) must be in [0, M] with M = 9", "got r = 10");
  EXPECT_ERROR(conv2d(at::Tensor()), "ConvNN2d: input must be 4-D [B,C,H,W]");
}

TEST(ConvNNLayerBadInput, ForwardRejectsAnInputOfAnotherDtype) {
  ConvNN1d layer(ConvNN1dOptions(4, 4, 3));
  EXPECT_ERROR(layer(randn({2, 4, 5}, at::kDouble)),
               "ConvNN1d: input is Double but the layer's parameters are Float");
  ConvNNAttention attention(ConvNNAttentionOptions(8, 2, 3));
  EXPECT_ERROR(attention(randn({2, 5, 8}, at::kDouble)),
               "ConvNNAttention: input is Double but the layer's parameters are Float");
}

TEST(ConvNNAttentionBadInput, ConstructorRejectsInvalidOptions) {
  EXPECT_ERROR(ConvNNAttention(ConvNNAttentionOptions(0, 1, 3)),
               "ConvNNAttention: embed_dim must be at least 1, got 0");
  EXPECT_ERROR(ConvNNAttention(ConvNNAttentionOptions(6, 4, 3)),
               "ConvNNAttention: num_heads = 4 must be at least 1 and divide embed_dim = 6");
  EXPECT_ERROR(ConvNNAttention(ConvNNAttentionOptions(6, 2, 0)),
               "ConvNNAttention: k must be at least 1, got 0");
  EXPECT_ERROR(ConvNNAttention(ConvNNAttentionOptions(6, 2, 3).dropout(1.0)),
               "dropout must be in [0, 1), got 1");
  EXPECT_ERROR(ConvNNAttention(ConvNNAttentionOptions(6, 2, 3).temperature(-1.0)),
               "temperature must be finite and at least 1.17549e-38 (the smallest normal float32, in which softmax accumulates), got -1");
  EXPECT_ERROR(ConvNNAttention(ConvNNAttentionOptions(6, 2, 3).num_candidates(-1)),
               "num_candidates must be non-negative");
}

TEST(ConvNNAttentionBadInput, ForwardRejectsWrongShapesAndMasks) {
  ConvNNAttention attention(ConvNNAttentionOptions(6, 2, 3));
  EXPECT_ERROR(attention(randn({2, 5, 4}, at::kFloat)),
               "ConvNNAttention: input must be [B,N,C] with C = embed_dim = 6, got [2, 5, 4]");
  EXPECT_ERROR(attention(randn({6}, at::kFloat)), "(or [N,C] for one sample)", "got [6]");
  ConvNNAttention masked(ConvNNAttentionOptions(6, 2, 3).mask(at::ones({4, 4}, at::kBool)));
  EXPECT_ERROR(masked(randn({2, 5, 6}, at::kFloat)),
               "ConvNNAttention: mask must be [N,N] = [5, 5] for this input, got [4, 4]");
}

TEST(BranchingConv2dBadInput, ConstructorAndForwardRejectInvalidInput) {
  EXPECT_ERROR(BranchingConv2d(BranchingConv2dOptions(4, 8).lambda(1.5)),
               "BranchingConv2d: lambda must be in [0, 1], got 1.5");
  EXPECT_ERROR(BranchingConv2d(BranchingConv2dOptions(4, 8).kernel_size(2)),
               "BranchingConv2d: kernel_size must be odd and positive (same padding), got 2");
  EXPECT_ERROR(BranchingConv2d(BranchingConv2dOptions(0, 8)),
               "in_channels and out_channels must be at least 1, got 0 and 8");
  // The ConvNN branch's own options are checked by ConvNN2d.
  EXPECT_ERROR(
      BranchingConv2d(BranchingConv2dOptions(4, 8).convnn(ConvNN2dOptions(4, 8, 3).heads(3))),
      "ConvNN2d: heads = 3 must be at least 1 and divide in_channels (4)");
  BranchingConv2d layer(BranchingConv2dOptions(4, 8, 3));
  EXPECT_ERROR(
      layer(randn({1, 3, 4, 4}, at::kFloat)),
      "BranchingConv2d: input must be [B,C,H,W] with C = in_channels = 4, got [1, 3, 4, 4]");
}

}  // namespace
