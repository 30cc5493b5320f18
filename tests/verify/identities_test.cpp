// The identities of DESIGN.md §2. First `run_identities` as a whole (every row passes, every
// identity is there), then each identity directly against a reference written here, parametrized
// over dtype, window size and aggregation, so that a failure names one identity. References are
// written independently of src/verify/identities.cpp.
#include "convnn/verify/identities.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>

#include "convnn/nn/functional/convnn.h"
#include "convnn/nn/modules/convnn.h"
#include "convnn/ops/knn_ops.h"
#include "support/assert_close.h"
#include "support/enum_lists.h"

namespace {

namespace F = convnn::nn::functional;
using convnn::Similarity;
using convnn::nn::Aggregation;
using convnn::nn::Rho;
using convnn::nn::SlotOrder;
using convnn::testing::AllClose;
using convnn::testing::max_abs_diff;
using convnn::verify::identity_tolerance;
using convnn::verify::IdentityResult;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

std::string dtype_name(c10::ScalarType dtype) {
  return dtype == at::kDouble ? "Float64" : "Float32";
}

at::TensorOptions options_of(c10::ScalarType dtype) { return at::TensorOptions().dtype(dtype); }

// ============================================================== run_identities as a whole

constexpr uint64_t kSuiteSeed = 20240601;

const std::vector<IdentityResult>& suite_rows(c10::ScalarType dtype) {
  static const auto float_rows = convnn::verify::run_identities(at::kFloat, kSuiteSeed);
  static const auto double_rows = convnn::verify::run_identities(at::kDouble, kSuiteSeed);
  return dtype == at::kDouble ? double_rows : float_rows;
}

::testing::AssertionResult AllRowsPass(const std::vector<IdentityResult>& rows) {
  std::ostringstream failed;
  for (const auto& r : rows) {
    if (!r.passed)
      failed << "\n  " << r.identity << " [" << r.configuration << "]: " << r.max_abs_error;
  }
  if (failed.str().empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "failing identities:" << failed.str();
}

class IdentitiesSuite : public ::testing::TestWithParam<c10::ScalarType> {};

TEST_P(IdentitiesSuite, EveryRowPassesWithinTheDtypeTolerance) {
  const auto& rows = suite_rows(GetParam());
  ASSERT_FALSE(rows.empty());
  EXPECT_TRUE(AllRowsPass(rows));
  for (const auto& r : rows) {
    EXPECT_EQ(r.tolerance, identity_tolerance(GetParam())) << r.identity;
    EXPECT_LE(r.max_abs_error, r.tolerance) << r.identity << " [" << r.configuration << "]";
    EXPECT_FALSE(r.configuration.empty()) << r.identity;
  }
}

TEST_P(IdentitiesSuite, CoversEveryIdentityOfDesignSection2) {
  const std::set<std::string> expected{"conv1d/standard/padded",
                                       "conv1d/standard/unpadded",
                                       "conv1d/depthwise/padded",
                                       "conv1d/depthwise/unpadded",
                                       "conv2d/standard/padded",
                                       "conv2d/standard/unpadded",
                                       "conv2d/depthwise/padded",
                                       "conv2d/depthwise/unpadded",
                                       "conv2d/module/standard",
                                       "conv2d/module/depthwise",
                                       "conv3d/standard/padded",
                                       "conv3d/depthwise/padded",
                                       "conv1d/dilated",
                                       "conv2d/dilated",
                                       "conv3d/dilated",
                                       "conv1d/strided",
                                       "conv2d/strided",
                                       "conv3d/strided",
                                       "conv2d/strided-dilated",
                                       "attention",
                                       "attention/module",
                                       "kvt",
                                       "kvt/causal",
                                       "kvt/cross",
                                       "kvt/module",
                                       "masked/additive",
                                       "masked/bool",
                                       "masked/causal",
                                       "masked/causal/module",
                                       "masked/bigbird",
                                       "masked/strided",
                                       "multihead",
                                       "multihead/per-head-kernel",
                                       "multihead/cross-random-candidates"};
  std::map<std::string, std::vector<std::string>> configurations;
  for (const auto& r : suite_rows(GetParam()))
    configurations[r.identity].push_back(r.configuration);
  std::set<std::string> present;
  for (const auto& [name, unused] : configurations) present.insert(name);
  EXPECT_EQ(present, expected);

  // Every window size for chebyshev, and the gaussian rows that show it holds for R = 3 and 5.
  const auto has = [&](const std::string& identity, const std::string& fragment) {
    for (const auto& c : configurations[identity]) {
      if (c.find(fragment) != std::string::npos) return true;
    }
    return false;
  };
  for (const int r : {3, 5, 7, 9}) {
    const auto window = "R=" + std::to_string(r) + " ";
    for (const auto* identity : {"conv1d/standard/padded", "conv1d/depthwise/unpadded",
                                 "conv2d/standard/unpadded", "conv2d/depthwise/unpadded"}) {
      EXPECT_TRUE(has(identity, window)) << identity << " lacks " << window;
    }
    for (const auto* identity : {"conv2d/standard/padded", "conv2d/depthwise/padded"}) {
      EXPECT_TRUE(has(identity, window + "K=" + std::to_string(r * r) + " chebyshev"))
          << identity << " lacks " << window;
    }
  }
  EXPECT_TRUE(has("conv2d/standard/padded", "R=3 K=9 gaussian"));
  EXPECT_TRUE(has("conv2d/standard/padded", "R=5 K=25 gaussian"));
  EXPECT_TRUE(has("conv2d/standard/padded", "11x11,10x14"));  // square and non-square maps
  for (const int r : {1, 3, 5}) {  // 3D: every window size for chebyshev, on a non-cubic volume
    for (const auto* identity : {"conv3d/standard/padded", "conv3d/depthwise/padded"}) {
      EXPECT_TRUE(has(identity, "R=" + std::to_string(r) + " K=" + std::to_string(r * r * r) + " chebyshev"))
          << identity << " lacks R=" << r;
    }
  }
  EXPECT_TRUE(has("conv3d/standard/padded", "R=3 K=27 gaussian"));
  EXPECT_TRUE(has("conv3d/standard/padded", "5x6x7"));
}

TEST_P(IdentitiesSuite, PassesOnOtherSeeds) {
  for (const uint64_t seed : {1u, 2u, 3u}) {
    EXPECT_TRUE(AllRowsPass(convnn::verify::run_identities(GetParam(), seed))) << "seed " << seed;
  }
}

TEST_P(IdentitiesSuite, IsReproducibleForAFixedSeed) {
  const auto again = convnn::verify::run_identities(GetParam(), kSuiteSeed);
  const auto& first = suite_rows(GetParam());
  ASSERT_EQ(again.size(), first.size());
  for (size_t i = 0; i < again.size(); ++i) {
    EXPECT_EQ(again[i].identity, first[i].identity);
    EXPECT_EQ(again[i].configuration, first[i].configuration);
    EXPECT_EQ(again[i].max_abs_error, first[i].max_abs_error) << again[i].identity;
  }
}

INSTANTIATE_TEST_SUITE_P(Identities, IdentitiesSuite, ::testing::Values(at::kFloat, at::kDouble),
                         [](const auto& info) { return dtype_name(info.param); });

TEST(Identities, ToleranceIs1em5ForFloat32And1em10ForFloat64) {
  EXPECT_EQ(identity_tolerance(at::kFloat), 1e-5);
  EXPECT_EQ(identity_tolerance(at::kDouble), 1e-10);
}

TEST(Identities, RunIdentitiesRejectsOtherDtypes) {
  EXPECT_THROW(convnn::verify::run_identities(at::kHalf, 0), c10::Error);
}

// ============================================================== convolution (Theorems 1-2)

constexpr int64_t kBatch = 2, kIn = 3, kOut = 4;

// A convolution: weight [C',C,R..] (standard) or [C,1,R..] (depthwise, groups = C) and bias.
struct Conv {
  at::Tensor weight, bias;
  int64_t groups;
  Aggregation aggregation;
  int64_t r;

  int64_t out_channels() const { return weight.size(0); }
  int64_t taps() const { return weight[0][0].numel(); }
  // The ConvNN kernel with the same taps, row-major: [C',C,R^d] or [C,R^d].
  at::Tensor convnn_kernel() const {
    return aggregation == Aggregation::Standard ? weight.flatten(2) : weight.flatten(1);
  }
};

Conv random_conv(int64_t dims, int64_t r, Aggregation aggregation, c10::ScalarType dtype) {
  const bool standard = aggregation == Aggregation::Standard;
  std::vector<int64_t> shape{standard ? kOut : kIn, standard ? kIn : 1};
  shape.insert(shape.end(), dims, r);
  const double fan_in = static_cast<double>(shape[1]) * std::pow(static_cast<double>(r), dims);
  return {torch::randn(shape, options_of(dtype)) / std::sqrt(fan_in),
          torch::randn({shape[0]}, options_of(dtype)), standard ? 1 : kIn, aggregation, r};
}

F::ConvNNFuncOptions convolution_setting(const Conv& conv, Similarity similarity, bool padded) {
  return F::ConvNNFuncOptions(conv.taps())
      .similarity(similarity)
      .coordinates(true)
      .alpha(0.0)
      .padding(padded ? conv.r / 2 : 0)
      .slot_order(SlotOrder::Index)
      .rho(Rho::Uniform);
}

at::Tensor same_padded_conv(const at::Tensor& x, const Conv& conv) {
  if (x.dim() == 3) return at::conv1d(x, conv.weight, conv.bias, 1, conv.r / 2, 1, conv.groups);
  if (x.dim() == 5) return at::conv3d(x, conv.weight, conv.bias, 1, conv.r / 2, 1, conv.groups);
  return at::conv2d(x, conv.weight, conv.bias, 1, conv.r / 2, 1, conv.groups);
}

// [size, R]: the positions of each position's window on one axis, shifted inwards at the edges.
at::Tensor shifted_windows(int64_t size, int64_t r) {
  const auto start = (torch::arange(size) - r / 2).clamp(0, size - r);
  return start.unsqueeze(1) + torch::arange(r).unsqueeze(0);
}

// The convolution over explicitly gathered shifted windows (no ATen convolution involved).
at::Tensor shifted_window_reference(const at::Tensor& x, const Conv& conv) {
  const bool standard = conv.aggregation == Aggregation::Standard;
  const auto b = x.size(0), c = x.size(1), r = conv.r;
  at::Tensor y;
  if (x.dim() == 3) {
    const auto l = x.size(2);
    const auto windows = x.index_select(2, shifted_windows(l, r).flatten()).view({b, c, l, r});
    y = standard ? torch::einsum("bclr,ocr->bol", {windows, conv.weight})
                 : torch::einsum("bclr,cr->bcl", {windows, conv.weight.squeeze(1)});
  } else {
    const auto h = x.size(2), w = x.size(3);
    const auto windows = x.index_select(2, shifted_windows(h, r).flatten())
                             .view({b, c, h, r, w})
                             .index_select(4, shifted_windows(w, r).flatten())
                             .view({b, c, h, r, w, r});  // [b,c,row,i,col,j]
    y = standard ? torch::einsum("bchiwj,ocij->bohw", {windows, conv.weight})
                 : torch::einsum("bchiwj,cij->bchw", {windows, conv.weight.squeeze(1)});
  }
  std::vector<int64_t> bias_shape(x.dim(), 1);
  bias_shape[1] = -1;
  return y + conv.bias.view(bias_shape);
}

std::string conv_name(c10::ScalarType dtype, int64_t r, Aggregation aggregation) {
  return dtype_name(dtype) + "_R" + std::to_string(r) + "_" +
         (aggregation == Aggregation::Standard ? "Standard" : "Depthwise");
}

using ConvParam = std::tuple<c10::ScalarType, int64_t, Aggregation>;

std::string conv_param_name(const ::testing::TestParamInfo<ConvParam>& info) {
  const auto& [dtype, r, aggregation] = info.param;
  return conv_name(dtype, r, aggregation);
}

const auto kDtypes = ::testing::Values(at::kFloat, at::kDouble);
const auto kAggregations = ::testing::Values(Aggregation::Standard, Aggregation::Depthwise);

class Conv1dIdentity : public ::testing::TestWithParam<ConvParam> {};

TEST_P(Conv1dIdentity, PaddedEqualsConv1dWithSamePadding) {
  const auto& [dtype, r, aggregation] = GetParam();
  torch::manual_seed(r);
  const auto conv = random_conv(1, r, aggregation, dtype);
  const auto x = torch::randn({kBatch, kIn, 17}, options_of(dtype));
  const auto y = F::conv_nn1d(x, conv.convnn_kernel(), conv.bias,
                              convolution_setting(conv, Similarity::Gaussian, true));
  EXPECT_TRUE(AllClose(y, same_padded_conv(x, conv), identity_tolerance(dtype)));
}

TEST_P(Conv1dIdentity, UnpaddedEqualsConv1dOfTheInwardShiftedWindowEverywhere) {
  const auto& [dtype, r, aggregation] = GetParam();
  torch::manual_seed(r + 100);
  const auto conv = random_conv(1, r, aggregation, dtype);
  const auto x = torch::randn({kBatch, kIn, 17}, options_of(dtype));
  const auto y = F::conv_nn1d(x, conv.convnn_kernel(), conv.bias,
                              convolution_setting(conv, Similarity::Gaussian, false));
  EXPECT_TRUE(AllClose(y, shifted_window_reference(x, conv), identity_tolerance(dtype)));
  // The interior is plain same-padded convolution; the edges are not (the skew is real).
  const auto interior = y.narrow(2, r / 2, x.size(2) - 2 * (r / 2));
  EXPECT_TRUE(AllClose(interior, same_padded_conv(x, conv).narrow(2, r / 2, interior.size(2)),
                       identity_tolerance(dtype)));
  EXPECT_GT(max_abs_diff(y.narrow(2, 0, 1), same_padded_conv(x, conv).narrow(2, 0, 1)), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Identities, Conv1dIdentity,
                         ::testing::Combine(kDtypes, ::testing::Values(3, 5, 7, 9), kAggregations),
                         conv_param_name);

// 2D: (dtype, R, aggregation, map). Square and non-square maps, every side >= 9.
using Conv2dParam = std::tuple<c10::ScalarType, int64_t, Aggregation, std::vector<int64_t>>;

std::string conv2d_param_name(const ::testing::TestParamInfo<Conv2dParam>& info) {
  const auto& [dtype, r, aggregation, map] = info.param;
  return conv_name(dtype, r, aggregation) + "_" + std::to_string(map[0]) + "x" +
         std::to_string(map[1]);
}

const auto kMaps = ::testing::Values(std::vector<int64_t>{10, 10}, std::vector<int64_t>{9, 13});

at::Tensor conv_nn2d_with(const at::Tensor& x, const Conv& conv, Similarity similarity,
                          bool padded) {
  return F::conv_nn2d(x, conv.convnn_kernel(), conv.bias,
                      convolution_setting(conv, similarity, padded));
}

class Conv2dIdentity : public ::testing::TestWithParam<Conv2dParam> {
 protected:
  void SetUp() override {
    const auto& [dtype, r, aggregation, map] = GetParam();
    torch::manual_seed(r * 31 + map[1]);
    conv = random_conv(2, r, aggregation, dtype);
    x = torch::randn({kBatch, kIn, map[0], map[1]}, options_of(dtype));
    tolerance = identity_tolerance(dtype);
  }
  Conv conv;
  at::Tensor x;
  double tolerance = 0.0;
};

TEST_P(Conv2dIdentity, PaddedChebyshevEqualsConv2dWithSamePadding) {
  EXPECT_TRUE(AllClose(conv_nn2d_with(x, conv, Similarity::Chebyshev, true),
                       same_padded_conv(x, conv), tolerance));
}

// gaussian's R² nearest positions are the R x R square while the square's corner, at squared
// distance 2(R/2)², is nearer than the first point beyond an edge, (R/2+1)²: R = 3 and 5 only.
TEST_P(Conv2dIdentity, PaddedGaussianEqualsConv2dOnlyWhileTheSquareIsTheNearestSet) {
  const auto y = conv_nn2d_with(x, conv, Similarity::Gaussian, true);
  if (conv.r <= 5) {
    EXPECT_TRUE(AllClose(y, same_padded_conv(x, conv), tolerance));
  } else {
    EXPECT_GT(max_abs_diff(y, same_padded_conv(x, conv)), 1e-3) << "a disc, not a square";
  }
}

// Positions where unpadded chebyshev ConvNN provably selects the inward-shifted window: the
// interior, and the diagonal (t,t) of every corner for t < R/2 (see src/verify/identities.cpp).
at::Tensor interior_and_corner_diagonals(int64_t h, int64_t w, int64_t r) {
  auto exact = torch::zeros({h, w}, torch::kBool);
  const int64_t half = r / 2;
  exact.slice(0, half, h - half).slice(1, half, w - half).fill_(true);
  for (int64_t t = 0; t < half; ++t) {
    exact.index_put_({t, t}, true);
    exact.index_put_({t, w - 1 - t}, true);
    exact.index_put_({h - 1 - t, t}, true);
    exact.index_put_({h - 1 - t, w - 1 - t}, true);
  }
  return exact;
}

TEST_P(Conv2dIdentity, UnpaddedEqualsShiftedWindowAtInteriorAndCornerDiagonals) {
  const auto y = conv_nn2d_with(x, conv, Similarity::Chebyshev, false);
  const auto reference = shifted_window_reference(x, conv);
  const auto exact = interior_and_corner_diagonals(x.size(2), x.size(3), conv.r).expand(y.sizes());
  EXPECT_TRUE(AllClose(y.masked_select(exact), reference.masked_select(exact), tolerance));
  // Mid-edge positions are not the per-axis skew the supplement describes.
  const auto top_middle = y.select(2, 0).select(2, x.size(3) / 2);
  EXPECT_GT(max_abs_diff(top_middle, reference.select(2, 0).select(2, x.size(3) / 2)), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Identities, Conv2dIdentity,
                         ::testing::Combine(kDtypes, ::testing::Values(3, 5, 7, 9), kAggregations,
                                            kMaps),
                         conv2d_param_name);

TEST(Identities, Conv2dStandardPaddedChebyshevR9) {
  torch::manual_seed(9);
  const auto conv = random_conv(2, 9, Aggregation::Standard, at::kFloat);
  const auto x = torch::randn({1, kIn, 12, 15});
  EXPECT_TRUE(AllClose(conv_nn2d_with(x, conv, Similarity::Chebyshev, true),
                       same_padded_conv(x, conv), identity_tolerance(at::kFloat)));
}

// Unpadded, off the corner diagonals, the window depends on the lower-index tie rule. On a 9x9
// grid (step 1/8, exact in binary, so equal distances tie exactly), position (0,4) with R = 3
// takes the 2x3 block at chebyshev distance 1 and the three lowest-index positions at distance 2,
// (0,2), (0,6), (1,2): not the shifted window rows 0..2 x columns 3..5.
TEST(Identities, Conv2dUnpaddedEdgeWindowFollowsTheTieRuleNotAnAxisSkew) {
  const auto coordinates = F::grid_coordinates({9, 9}, options_of(at::kDouble)).unsqueeze(0);
  const auto [scores, indices] =
      convnn::ops::knn_select(coordinates, coordinates, 9, "chebyshev", c10::nullopt, true);
  const auto selected = indices[0][4];
  const auto tie_rule = torch::tensor({2, 3, 4, 5, 6, 11, 12, 13, 14}, torch::kLong);
  const auto shifted_window = torch::tensor({3, 4, 5, 12, 13, 14, 21, 22, 23}, torch::kLong);
  EXPECT_TRUE(torch::equal(selected, tie_rule)) << selected;
  EXPECT_FALSE(torch::equal(selected, shifted_window));
  // Corner (0,0): the chebyshev ball of radius 2 is exactly the 3x3 corner window.
  EXPECT_TRUE(
      torch::equal(indices[0][0], torch::tensor({0, 1, 2, 9, 10, 11, 18, 19, 20}, torch::kLong)));
}

// Caveat (a) of DESIGN.md: per-axis normalised coordinates i/(H-1), j/(W-1) give the axes
// different steps on a non-square map, and the selected window stops being R x R.
TEST(Identities, Conv2dNeedsTheSameCoordinateStepOnBothAxes) {
  torch::manual_seed(5);
  const int64_t r = 3, h = 5, w = 12;
  const auto conv = random_conv(2, r, Aggregation::Standard, at::kDouble);
  const auto x = torch::randn({1, kIn, h, w}, options_of(at::kDouble));
  const auto padded = at::constant_pad_nd(x, {1, 1, 1, 1});
  const auto tokens = padded.flatten(2).transpose(1, 2);
  const int64_t ph = h + 2, pw = w + 2;
  const auto run = [&](const at::Tensor& coordinates) {
    const auto out =
        F::conv_nn(tokens, tokens, tokens, conv.convnn_kernel(), conv.bias,
                   convolution_setting(conv, Similarity::Gaussian, false), coordinates);
    return out.transpose(1, 2).reshape({1, kOut, ph, pw}).narrow(2, 1, h).narrow(3, 1, w);
  };
  const auto grid =
      torch::meshgrid({torch::arange(ph, torch::kDouble), torch::arange(pw, torch::kDouble)}, "ij");
  const auto per_axis =
      torch::stack({grid[0].flatten() / (ph - 1), grid[1].flatten() / (pw - 1)}, 1);
  const auto reference = same_padded_conv(x, conv);
  EXPECT_TRUE(
      AllClose(run(F::grid_coordinates({ph, pw}, options_of(at::kDouble))), reference, 1e-10));
  EXPECT_GT(max_abs_diff(run(per_axis), reference), 1e-3);
}

// 3D: (dtype, R, aggregation) on a non-cubic volume. With spatial coordinates only, chebyshev,
// K = R³, index order and uniform rho, the R³ nearest voxels of each query in the zero-padded
// volume are its R x R x R window in raster order: conv3d with same padding.
using Conv3dParam = std::tuple<c10::ScalarType, int64_t, Aggregation>;

class Conv3dIdentity : public ::testing::TestWithParam<Conv3dParam> {
 protected:
  void SetUp() override {
    const auto& [dtype, r, aggregation] = GetParam();
    torch::manual_seed(r * 17 + (aggregation == Aggregation::Standard ? 1 : 2));
    conv = random_conv(3, r, aggregation, dtype);
    x = torch::randn({kBatch, kIn, 5, 6, 7}, options_of(dtype));
    tolerance = identity_tolerance(dtype);
  }
  at::Tensor conv_nn3d_with(Similarity similarity) const {
    return F::conv_nn3d(x, conv.convnn_kernel(), conv.bias, convolution_setting(conv, similarity, true));
  }
  Conv conv;
  at::Tensor x;
  double tolerance = 0.0;
};

TEST_P(Conv3dIdentity, PaddedChebyshevEqualsConv3dWithSamePadding) {
  EXPECT_TRUE(AllClose(conv_nn3d_with(Similarity::Chebyshev), same_padded_conv(x, conv), tolerance));
}

// gaussian (Euclidean) selection: the R³ nearest voxels are the cube while its corner, at squared
// distance 3(R/2)², is nearer than the first voxel beyond a face, (R/2+1)²: R = 1 and 3 only. At
// R = 5 the corner (2,2,2) (12) is farther than (3,0,0) (9): the R³ nearest form a ball.
TEST_P(Conv3dIdentity, PaddedGaussianEqualsConv3dOnlyUpToR3) {
  const auto y = conv_nn3d_with(Similarity::Gaussian);
  if (conv.r <= 3) {
    EXPECT_TRUE(AllClose(y, same_padded_conv(x, conv), tolerance));
  } else {
    EXPECT_GT(max_abs_diff(y, same_padded_conv(x, conv)), 1e-3) << "a ball, not a cube";
  }
}

INSTANTIATE_TEST_SUITE_P(Identities, Conv3dIdentity,
                         ::testing::Combine(kDtypes, ::testing::Values(1, 3, 5), kAggregations),
                         conv_param_name);

// Dilation and stride (per axis): coordinates only, chebyshev, K = R^d, index order, uniform rho.
// Dilation d: the candidates of a query are its dilated grid with one dilated step a coordinate
// unit, so the K nearest are the dilated window: a dilated convolution (padding max d * (R/2) on
// every axis covers each axis's d_a * (R/2); the extra padded positions are farther than the
// window). Stride s: the queries are every s-th position, so the output is the strided
// convolution's with same padding R/2 (ceil(size / s) positions per axis).
struct StridedCase {
  int64_t dims, r;
  std::vector<int64_t> stride, dilation, map;
};

std::string describe(const StridedCase& c) {
  const auto join = [](const std::vector<int64_t>& v) {
    std::string text;
    for (const int64_t x : v) text += (text.empty() ? "" : "x") + std::to_string(x);
    return text;
  };
  return std::to_string(c.dims) + "d_R" + std::to_string(c.r) + "_stride" + join(c.stride) + "_dilation" +
         join(c.dilation);
}

std::string strided_case_name(const ::testing::TestParamInfo<StridedCase>& info) { return describe(info.param); }

// GoogleTest prints a parameter by its name, not its bytes.
void PrintTo(const StridedCase& c, std::ostream* os) { *os << describe(c); }

class StridedDilatedIdentity : public ::testing::TestWithParam<StridedCase> {};

TEST_P(StridedDilatedIdentity, EqualsTheStridedDilatedConvolution) {
  const auto& c = GetParam();
  for (const auto aggregation : {Aggregation::Standard, Aggregation::Depthwise}) {
    for (const auto dtype : {at::kFloat, at::kDouble}) {
      torch::manual_seed(c.r * 7 + c.dims);
      const auto conv = random_conv(c.dims, c.r, aggregation, dtype);
      std::vector<int64_t> shape{kBatch, kIn};
      shape.insert(shape.end(), c.map.begin(), c.map.end());
      const auto x = torch::randn(shape, options_of(dtype));
      std::vector<int64_t> padding;
      for (const int64_t d : c.dilation) padding.push_back(d * (c.r / 2));
      const int64_t pad = *std::max_element(padding.begin(), padding.end());
      const auto options = convolution_setting(conv, Similarity::Chebyshev, true).padding(pad).stride(c.stride)
                               .dilation(c.dilation);
      const auto y = c.dims == 1   ? F::conv_nn1d(x, conv.convnn_kernel(), conv.bias, options)
                     : c.dims == 2 ? F::conv_nn2d(x, conv.convnn_kernel(), conv.bias, options)
                                   : F::conv_nn3d(x, conv.convnn_kernel(), conv.bias, options);
      const std::vector<int64_t> no_output_padding(c.dims, 0);
      const auto reference = at::convolution(x, conv.weight, conv.bias, c.stride, padding, c.dilation, false,
                                             no_output_padding, conv.groups);
      EXPECT_TRUE(AllClose(y, reference, identity_tolerance(dtype)))
          << (aggregation == Aggregation::Standard ? "standard " : "depthwise ") << c10::toString(dtype);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Identities, StridedDilatedIdentity,
    ::testing::Values(StridedCase{1, 3, {1}, {2}, {17}}, StridedCase{1, 5, {2}, {1}, {17}},
                      StridedCase{1, 3, {3}, {2}, {16}}, StridedCase{2, 3, {1, 1}, {2, 2}, {9, 11}},
                      StridedCase{2, 3, {1, 1}, {1, 3}, {8, 12}}, StridedCase{2, 5, {2, 2}, {1, 1}, {9, 10}},
                      StridedCase{2, 3, {2, 1}, {1, 1}, {7, 8}}, StridedCase{2, 3, {2, 2}, {2, 2}, {10, 9}},
                      StridedCase{3, 3, {1, 1, 1}, {2, 1, 2}, {5, 4, 6}},
                      StridedCase{3, 3, {2, 1, 2}, {1, 1, 1}, {5, 4, 6}},
                      StridedCase{3, 3, {2, 2, 2}, {2, 2, 2}, {6, 5, 7}}),
    strided_case_name);

// The modules with a convolution's weights copied in.
class ConvModuleIdentity : public ::testing::TestWithParam<Aggregation> {};

template <typename Options>
Options convolution_module_options(Options options, const Conv& conv) {
  return options.similarity(Similarity::Chebyshev)
      .coordinates(true)
      .alpha(0.0)
      .padding(conv.r / 2)
      .slot_order(SlotOrder::Index)
      .rho(Rho::Uniform)
      .aggregation(conv.aggregation)
      .bias(true);
}

template <typename Module>
void load_conv(Module& module, const Conv& conv) {
  torch::NoGradGuard no_grad;
  module->kernel.copy_(conv.convnn_kernel());
  module->bias.copy_(conv.bias);
}

TEST_P(ConvModuleIdentity, ConvNN2dWithConvWeightsEqualsConv2d) {
  torch::manual_seed(2);
  const auto conv = random_conv(2, 5, GetParam(), at::kFloat);
  convnn::nn::ConvNN2d module(convolution_module_options(
      convnn::nn::ConvNN2dOptions(kIn, conv.out_channels(), conv.taps()), conv));
  load_conv(module, conv);
  const auto x = torch::randn({kBatch, kIn, 9, 13});
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(AllClose(module(x), same_padded_conv(x, conv), identity_tolerance(at::kFloat)));
}

TEST_P(ConvModuleIdentity, ConvNN1dWithConvWeightsEqualsConv1d) {
  torch::manual_seed(1);
  const auto conv = random_conv(1, 7, GetParam(), at::kFloat);
  convnn::nn::ConvNN1d module(convolution_module_options(
      convnn::nn::ConvNN1dOptions(kIn, conv.out_channels(), conv.taps()), conv));
  load_conv(module, conv);
  const auto x = torch::randn({kBatch, kIn, 19});
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(AllClose(module(x), same_padded_conv(x, conv), identity_tolerance(at::kFloat)));
}

TEST_P(ConvModuleIdentity, ConvNN3dWithConvWeightsEqualsConv3d) {
  torch::manual_seed(3);
  const auto conv = random_conv(3, 3, GetParam(), at::kFloat);
  convnn::nn::ConvNN3d module(convolution_module_options(
      convnn::nn::ConvNN3dOptions(kIn, conv.out_channels(), conv.taps()), conv));
  load_conv(module, conv);
  const auto x = torch::randn({kBatch, kIn, 4, 5, 6});
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(AllClose(module(x), same_padded_conv(x, conv), identity_tolerance(at::kFloat)));
}

INSTANTIATE_TEST_SUITE_P(Identities, ConvModuleIdentity, kAggregations, [](const auto& info) {
  return std::string(info.param == Aggregation::Standard ? "Standard" : "Depthwise");
});

// ============================================================== attention (Theorems 3.1-3.3)

constexpr int64_t kHeads = 2, kHeadDim = 8, kTokens = 20;

// Per-head layout [B,H,N,d] <-> token layout [B,N,H*d].
at::Tensor to_tokens(const at::Tensor& x) { return x.transpose(1, 2).flatten(2); }
at::Tensor to_heads(const at::Tensor& x, int64_t heads = kHeads) {
  return x.unflatten(2, {heads, -1}).transpose(1, 2);
}

struct Qkv {
  at::Tensor q, k, v;  // [B,H,N,d], [B,H,M,d], [B,H,M,d]
};

Qkv random_qkv(c10::ScalarType dtype, int64_t n, int64_t m, uint64_t seed) {
  torch::manual_seed(seed);
  const auto o = options_of(dtype);
  return {torch::randn({kBatch, kHeads, n, kHeadDim}, o),
          torch::randn({kBatch, kHeads, m, kHeadDim}, o),
          torch::randn({kBatch, kHeads, m, kHeadDim}, o)};
}

F::ConvNNFuncOptions attention_setting(int64_t k) {
  return F::ConvNNFuncOptions(k).similarity(Similarity::ScaledDot).rho(Rho::Softmax).heads(kHeads);
}

// ConvNN with the attention setting and a depthwise kernel of ones, back in [B,H,N,d].
at::Tensor convnn_attention(const Qkv& t, F::ConvNNFuncOptions options) {
  const auto ones = torch::ones({kHeadDim, options.k()}, t.q.options());
  return to_heads(F::conv_nn(to_tokens(t.q), to_tokens(t.k), to_tokens(t.v), ones, {}, options));
}

// Each row keeps its top-k entries: a stable descending sort puts the lower column first among
// equal scores, and the first k columns of the sorted order are marked kept.
at::Tensor top_k_kept(const at::Tensor& scores, int64_t k) {
  const auto order =
      std::get<1>(torch::sort(scores, c10::optional<bool>(true), /*dim=*/-1, /*descending=*/true));
  return torch::zeros_like(scores, torch::kBool).scatter(-1, order.narrow(-1, 0, k), true);
}

// KVT: softmax over each row's top-k scaled dot products (after the mask), times V.
at::Tensor kvt_reference(const Qkv& t, int64_t k, const at::Tensor& allowed = {}) {
  auto scores =
      torch::matmul(t.q, t.k.transpose(-2, -1)) / std::sqrt(static_cast<double>(kHeadDim));
  if (allowed.defined()) scores = scores.masked_fill(~allowed, kNegInf);
  return torch::matmul(torch::softmax(scores.masked_fill(~top_k_kept(scores, k), kNegInf), -1),
                       t.v);
}

class AttentionIdentity : public ::testing::TestWithParam<c10::ScalarType> {
 protected:
  double tolerance() const { return identity_tolerance(GetParam()); }
  Qkv self_attention(uint64_t seed) const { return random_qkv(GetParam(), kTokens, kTokens, seed); }
};

TEST_P(AttentionIdentity, AttentionWhenKEqualsN) {
  const auto t = self_attention(1);
  EXPECT_TRUE(AllClose(convnn_attention(t, attention_setting(kTokens)),
                       at::scaled_dot_product_attention(t.q, t.k, t.v), tolerance()));
}

TEST_P(AttentionIdentity, AttentionWithCrossKeysWhenKEqualsM) {
  const auto t = random_qkv(GetParam(), kTokens, 27, 2);
  EXPECT_TRUE(AllClose(convnn_attention(t, attention_setting(27)),
                       at::scaled_dot_product_attention(t.q, t.k, t.v), tolerance()));
}

TEST_P(AttentionIdentity, KvtWhenKLessThanNForEveryK) {
  const auto t = self_attention(3);
  for (const int64_t k : std::vector<int64_t>{1, 2, 7, kTokens - 1, kTokens}) {
    EXPECT_TRUE(
        AllClose(convnn_attention(t, attention_setting(k)), kvt_reference(t, k), tolerance()))
        << "K = " << k;
  }
}

TEST_P(AttentionIdentity, KvtWithCrossKeysForKFrom1ToM) {
  const int64_t m = 29;
  const auto t = random_qkv(GetParam(), kTokens, m, 4);
  for (const int64_t k : std::vector<int64_t>{1, 6, m}) {
    EXPECT_TRUE(
        AllClose(convnn_attention(t, attention_setting(k)), kvt_reference(t, k), tolerance()))
        << "K = " << k;
  }
}

// Random candidates (r of M, one draw shared by batch and heads): top-k over the drawn columns.
TEST_P(AttentionIdentity, KvtOverRandomCandidatesForKFrom1ToR) {
  const int64_t m = 31, r = 12;
  const auto t = random_qkv(GetParam(), kTokens, m, 5);
  const auto generator = [] { return at::make_generator<at::CPUGeneratorImpl>(77); };
  const auto drawn = F::draw_candidates(m, r, generator(), at::kCPU);
  const auto allowed =
      torch::zeros({m}, torch::kBool).index_fill(0, drawn, true).expand({kTokens, m});
  for (const int64_t k : std::vector<int64_t>{1, 5, r}) {
    const auto options = attention_setting(k).num_candidates(r).generator(generator());
    EXPECT_TRUE(AllClose(convnn_attention(t, options), kvt_reference(t, k, allowed), tolerance()))
        << "K = " << k;
  }
}

// Keys 10..19 repeat keys 0..9 (with different values), so every score ties with another one; the
// lower index must win, as in the reference. Queries and keys are small integers: every dot product
// is then exact whatever the summation order, so the ties are exact in the reference's GEMM and in
// convnn's kernels alike. (With Gaussian inputs an MKL GEMM may score two identical key columns a
// few ulps apart, on some CPUs, and the reference would no longer see a tie.)
TEST_P(AttentionIdentity, KvtWithTiedScoresKeepsTheLowerIndex) {
  auto t = self_attention(6);
  t.q = torch::randint(-2, 3, t.q.sizes(), t.q.options());
  const auto half = torch::randint(-2, 3, t.k.narrow(2, 0, kTokens / 2).sizes(), t.k.options());
  t.k = torch::cat({half, half}, 2);
  for (const int64_t k : {1, 3, 5}) {
    EXPECT_TRUE(
        AllClose(convnn_attention(t, attention_setting(k)), kvt_reference(t, k), tolerance()))
        << "K = " << k;
  }
}

TEST_P(AttentionIdentity, MaskedAttentionWithAnAdditiveMask) {
  const auto t = self_attention(7);
  const auto allowed = (torch::rand({kTokens, kTokens}) < 0.4) | torch::eye(kTokens, torch::kBool);
  const auto additive =
      torch::zeros({kTokens, kTokens}, t.q.options()).masked_fill(~allowed, kNegInf);
  EXPECT_TRUE(AllClose(convnn_attention(t, attention_setting(kTokens).mask(additive)),
                       at::scaled_dot_product_attention(t.q, t.k, t.v, additive), tolerance()));
}

TEST_P(AttentionIdentity, MaskedAttentionWithABoolMask) {
  const auto t = self_attention(8);
  const auto allowed = (torch::rand({kTokens, kTokens}) < 0.4) | torch::eye(kTokens, torch::kBool);
  EXPECT_TRUE(AllClose(convnn_attention(t, attention_setting(kTokens).mask(allowed)),
                       at::scaled_dot_product_attention(t.q, t.k, t.v, allowed), tolerance()));
}

TEST_P(AttentionIdentity, MaskedAttentionWithAPerSliceMask) {
  const auto t = self_attention(9);
  const auto allowed = (torch::rand({kBatch * kHeads, kTokens, kTokens}) < 0.4) |
                       torch::eye(kTokens, torch::kBool).unsqueeze(0);
  EXPECT_TRUE(AllClose(convnn_attention(t, attention_setting(kTokens).mask(allowed)),
                       at::scaled_dot_product_attention(
                           t.q, t.k, t.v, allowed.view({kBatch, kHeads, kTokens, kTokens})),
                       tolerance()));
}

TEST_P(AttentionIdentity, CausalAttention) {
  const auto t = self_attention(10);
  EXPECT_TRUE(AllClose(
      convnn_attention(t, attention_setting(kTokens).mask(F::causal_mask(kTokens))),
      at::scaled_dot_product_attention(t.q, t.k, t.v, {}, 0.0, /*is_causal=*/true), tolerance()));
}

TEST_P(AttentionIdentity, BigBirdAttention) {
  const auto t = self_attention(11);
  const auto mask = F::bigbird_mask(kTokens, 2, 1, 3, at::make_generator<at::CPUGeneratorImpl>(3));
  EXPECT_TRUE(AllClose(convnn_attention(t, attention_setting(kTokens).mask(mask)),
                       at::scaled_dot_product_attention(t.q, t.k, t.v, mask), tolerance()));
}

TEST_P(AttentionIdentity, StridedAttention) {
  const auto t = self_attention(12);
  for (const bool causal : {true, false}) {
    const auto mask = F::strided_mask(kTokens, 4, causal);
    EXPECT_TRUE(AllClose(convnn_attention(t, attention_setting(kTokens).mask(mask)),
                         at::scaled_dot_product_attention(t.q, t.k, t.v, mask), tolerance()))
        << "causal = " << causal;
  }
}

TEST_P(AttentionIdentity, MaskedKvtWhenKLessThanN) {
  const auto t = self_attention(13);
  const auto causal = F::causal_mask(kTokens);
  for (const int64_t k : std::vector<int64_t>{1, 4, kTokens}) {
    EXPECT_TRUE(AllClose(convnn_attention(t, attention_setting(k).mask(causal)),
                         kvt_reference(t, k, causal), tolerance()))
        << "K = " << k;
  }
}

// Causal with K = N: row i has i+1 valid candidates, and the N-i-1 masked slots weigh exactly 0.
// With uniform rho, row i is then the plain sum of v_0..v_i.
TEST_P(AttentionIdentity, MaskedSlotsOfRowsWithFewerValidCandidatesThanKWeighZero) {
  const auto t = self_attention(14);
  const auto options = attention_setting(kTokens).mask(F::causal_mask(kTokens)).rho(Rho::Uniform);
  EXPECT_TRUE(AllClose(convnn_attention(t, options), t.v.cumsum(2), tolerance() * kTokens));
  const auto softmax_rows =
      convnn_attention(t, attention_setting(kTokens).mask(F::causal_mask(kTokens)));
  EXPECT_TRUE(
      AllClose(softmax_rows.select(2, 0), t.v.select(2, 0), tolerance()));  // one valid slot
}

INSTANTIATE_TEST_SUITE_P(Identities, AttentionIdentity, kDtypes,
                         [](const auto& info) { return dtype_name(info.param); });

// ConvNNAttention against multi-head self-attention written out with its own weights.
class AttentionModuleIdentity : public ::testing::TestWithParam<c10::ScalarType> {
 protected:
  convnn::nn::ConvNNAttention module(int64_t k, bool causal = false) const {
    torch::manual_seed(k);
    convnn::nn::ConvNNAttention m(
        convnn::nn::ConvNNAttentionOptions(kHeads * kHeadDim, kHeads, k).causal(causal));
    m->to(GetParam());
    m->eval();
    return m;
  }
  at::Tensor input() const {
    return torch::randn({kBatch, kTokens, kHeads * kHeadDim}, options_of(GetParam()));
  }
};

// softmax(QK^T/sqrt(d))V per head from the module's projections (no biases, as configured), then
// the output projection; `attend` is the per-head attention.
template <typename Attend>
at::Tensor hand_written_mhsa(convnn::nn::ConvNNAttention& m, const at::Tensor& x, Attend attend) {
  const auto project = [&](torch::nn::Linear& linear) {
    return to_heads(torch::matmul(x, linear->weight.t()));
  };
  const Qkv heads{project(m->query_projection), project(m->key_projection),
                  project(m->value_projection)};
  return torch::matmul(to_tokens(attend(heads)), m->output_projection->weight.t());
}

TEST_P(AttentionModuleIdentity, AttentionModuleEqualsMultiHeadSelfAttention) {
  auto m = module(kTokens);
  const auto x = input();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(AllClose(
      m(x),
      hand_written_mhsa(
          m, x, [](const Qkv& t) { return at::scaled_dot_product_attention(t.q, t.k, t.v); }),
      identity_tolerance(GetParam())));
}

TEST_P(AttentionModuleIdentity, KvtModuleEqualsTopKMultiHeadAttention) {
  const int64_t k = 6;
  auto m = module(k);
  const auto x = input();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(AllClose(m(x),
                       hand_written_mhsa(m, x, [&](const Qkv& t) { return kvt_reference(t, k); }),
                       identity_tolerance(GetParam())));
}

TEST_P(AttentionModuleIdentity, CausalModuleEqualsCausalMultiHeadAttention) {
  auto m = module(kTokens, /*causal=*/true);
  const auto x = input();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(AllClose(m(x),
                       hand_written_mhsa(m, x,
                                         [](const Qkv& t) {
                                           return at::scaled_dot_product_attention(
                                               t.q, t.k, t.v, {}, 0.0, /*is_causal=*/true);
                                         }),
                       identity_tolerance(GetParam())));
}

INSTANTIATE_TEST_SUITE_P(Identities, AttentionModuleIdentity, kDtypes,
                         [](const auto& info) { return dtype_name(info.param); });

// ============================================================== multi-head (Theorem 4)

// H heads folded into the batch against H single-head calls on each head's channels.
struct MultiHeadCase {
  std::string name;
  int64_t m;  // candidates; != kTokens means cross keys
  F::ConvNNFuncOptions options;
  bool standard_kernel;
  bool random_mask = false;  // a random bool [N,M] mask, drawn in the test
};

void PrintTo(const MultiHeadCase& c, std::ostream* os) { *os << c.name; }

class MultiHeadIdentity
    : public ::testing::TestWithParam<std::tuple<c10::ScalarType, MultiHeadCase>> {};

// Options with a fresh generator of a fixed seed, so that every call draws the same candidates.
F::ConvNNFuncOptions with_draw(F::ConvNNFuncOptions options) {
  return options.generator(at::make_generator<at::CPUGeneratorImpl>(123));
}

TEST_P(MultiHeadIdentity, FoldedHeadsEqualIndependentSingleHeadCalls) {
  const auto& [dtype, c] = GetParam();
  const auto t = random_qkv(dtype, kTokens, c.m, 42);
  auto options = c.options;
  if (c.random_mask) options.mask(torch::rand({kTokens, c.m}) < 0.5);
  const bool per_head = c.options.kernel_per_head();
  const int64_t k = c.options.k(), out_dim = c.standard_kernel ? 5 : kHeadDim;
  std::vector<int64_t> kernel_shape{k};
  if (c.standard_kernel)
    kernel_shape.insert(kernel_shape.begin(), {out_dim, kHeadDim});
  else
    kernel_shape.insert(kernel_shape.begin(), kHeadDim);
  if (per_head) kernel_shape.insert(kernel_shape.begin(), kHeads);
  const auto kernel = torch::randn(kernel_shape, options_of(dtype));
  const auto bias = per_head ? torch::randn({kHeads, out_dim}, options_of(dtype))
                             : torch::randn({out_dim}, options_of(dtype));

  const auto folded =
      F::conv_nn(to_tokens(t.q), to_tokens(t.k), to_tokens(t.v), kernel, bias, with_draw(options));
  auto single = options;
  single.heads(1).kernel_per_head(false);
  std::vector<at::Tensor> heads;
  for (int64_t h = 0; h < kHeads; ++h) {
    const auto slice = [&](const at::Tensor& x) { return x.select(1, h); };  // [B,N,d]
    heads.push_back(F::conv_nn(slice(t.q), slice(t.k), slice(t.v), per_head ? kernel[h] : kernel,
                               per_head ? bias[h] : bias, with_draw(single)));
  }
  EXPECT_TRUE(AllClose(folded, torch::cat(heads, -1), identity_tolerance(dtype)));
}

const auto kMultiHeadCases = ::testing::Values(
    MultiHeadCase{"KvtSharedDepthwise", kTokens, attention_setting(7), false},
    MultiHeadCase{"KEquals1", kTokens, attention_setting(1), false},
    MultiHeadCase{"KEqualsN", kTokens, attention_setting(kTokens), false},
    MultiHeadCase{"PerHeadStandardKernelCosineIndexOrder", kTokens,
                  F::ConvNNFuncOptions(6)
                      .similarity(Similarity::Cosine)
                      .slot_order(SlotOrder::Index)
                      .heads(kHeads)
                      .kernel_per_head(true),
                  true},
    MultiHeadCase{"CrossKeysKEqualsM", 26, attention_setting(26).rho(Rho::Mean), false},
    MultiHeadCase{
        "CrossKeysRandomCandidatesMasked", 26,
        F::ConvNNFuncOptions(4).similarity(Similarity::Dot).heads(kHeads).num_candidates(11), true,
        /*random_mask=*/true},
    MultiHeadCase{"RandomCandidatesIncludeSelfGaussian", kTokens,
                  F::ConvNNFuncOptions(5)
                      .similarity(Similarity::Gaussian)
                      .heads(kHeads)
                      .num_candidates(9)
                      .include_self(true)
                      .rho(Rho::Softmax),
                  false});

INSTANTIATE_TEST_SUITE_P(Identities, MultiHeadIdentity,
                         ::testing::Combine(kDtypes, kMultiHeadCases), [](const auto& info) {
                           return dtype_name(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param).name;
                         });

}  // namespace
