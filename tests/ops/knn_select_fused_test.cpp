// The fused CPU knn_select (src/ops/cpu) agrees with the plain-ATen reference: same indices, and
// scores whose error against float64 is at most twice the reference's own.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <tuple>
#include <vector>

#include "ops/cpu/isa.h"
#include "ops/cpu/knn_select_cpu.h"
#include "ops/reference/reference.h"
#include "support/assert_close.h"

namespace knn_select_fused_test {  // apart from the files of its unity batch (tests/CMakeLists.txt)

namespace {

using convnn::Similarity;
using convnn::testing::AllClose;
using convnn::testing::max_abs_diff;

const std::vector<std::string>& kSimilarities = convnn::similarity_names();

std::tuple<torch::Tensor, torch::Tensor> reference_select(const torch::Tensor& q, const torch::Tensor& k,
                                                          int64_t top, const std::string& similarity,
                                                          const c10::optional<torch::Tensor>& mask,
                                                          bool index_order) {
  return convnn::reference::knn_select(q, k, top, convnn::parse_similarity(similarity), mask, index_order);
}

void expect_same_selection(const torch::Tensor& q, const torch::Tensor& k, int64_t top,
                           const std::string& similarity, const c10::optional<torch::Tensor>& mask,
                           bool index_order) {
  auto [fused_scores, fused_indices] = convnn::cpu::knn_select(q, k, top, similarity, mask, index_order);
  auto [ref_scores, ref_indices] = reference_select(q, k, top, similarity, mask, index_order);
  SCOPED_TRACE(similarity + " k=" + std::to_string(top) + (index_order ? " index order" : ""));
  EXPECT_TRUE(torch::equal(fused_indices, ref_indices));
  const double tolerance = 64 * convnn::testing::epsilon_of(q.scalar_type());
  EXPECT_TRUE(AllClose(fused_scores, ref_scores, tolerance, tolerance));
}

// Gaussian's distance as the fused CPU select defines it: the float32 sum, in feature order from
// zero, of (q_j - k_j)^2, each step one fused multiply-add where the kernels run their AVX2 build,
// a rounded product then a rounded sum in the baseline build (docs/operator.md, "Ties").
float gaussian_distance(const float* q, const float* k, int64_t d) {
  const bool fused = convnn::cpu::runtime_isa() == convnn::cpu::Isa::Avx2;
  float sum = 0;
  for (int64_t j = 0; j < d; ++j) {
    const float diff = q[j] - k[j];
    if (fused) {
      sum = std::fma(diff, diff, sum);
    } else {
      volatile float square = diff * diff;  // no contraction into a fused multiply-add
      sum = sum + square;
    }
  }
  return sum;
}

// The Gaussian selection emulated from gaussian_distance: ranking keys -distance (-inf where the
// bool mask forbids a key, plus the additive mask), the top `top` of each row in descending order
// with ties to the lower index (index_order: then by index), reported as exp(key) (masked: -inf).
std::tuple<torch::Tensor, torch::Tensor> emulated_gaussian_select(const torch::Tensor& q, const torch::Tensor& k,
                                                                  int64_t top, const torch::Tensor& mask,
                                                                  bool index_order) {
  const int64_t g_size = q.size(0), n = q.size(1), m = k.size(1), d = q.size(2);
  const auto qc = q.contiguous(), kc = k.contiguous();
  const bool bool_mask = mask.defined() && mask.scalar_type() == torch::kBool;
  const auto allowed = bool_mask ? mask.expand({g_size, n, m}).contiguous() : torch::Tensor();
  const auto added = mask.defined() && !bool_mask ? mask.expand({g_size, n, m}).contiguous() : torch::Tensor();
  auto scores = torch::empty({g_size, n, top}, torch::kFloat);
  auto indices = torch::empty({g_size, n, top}, torch::kLong);
  std::vector<float> keys(m);
  std::vector<int64_t> order(m);
  for (int64_t row = 0; row < g_size * n; ++row) {
    const int64_t g = row / n;
    for (int64_t j = 0; j < m; ++j) {
      float key = -gaussian_distance(qc.data_ptr<float>() + row * d, kc.data_ptr<float>() + (g * m + j) * d, d);
      if (bool_mask && !allowed.data_ptr<bool>()[row * m + j]) key = -std::numeric_limits<float>::infinity();
      if (added.defined()) key += added.data_ptr<float>()[row * m + j];
      keys[j] = key;
    }
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return keys[a] > keys[b]; });
    if (index_order) std::sort(order.begin(), order.begin() + top);
    for (int64_t s = 0; s < top; ++s) {
      const float key = keys[order[s]];
      scores.data_ptr<float>()[row * top + s] = key == -std::numeric_limits<float>::infinity() ? key : std::exp(key);
      indices.data_ptr<int64_t>()[row * top + s] = order[s];
    }
  }
  return {scores, indices};
}

// q and k in float32, bfloat16 or float16: the kernels sum in float32 whatever the input type.
void expect_emulated_gaussian(const torch::Tensor& q, const torch::Tensor& k, int64_t top, const torch::Tensor& mask,
                              bool index_order) {
  SCOPED_TRACE(std::string(c10::toString(q.scalar_type())) + " k=" + std::to_string(top) + " M=" +
               std::to_string(k.size(1)) + " D=" + std::to_string(q.size(2)) + (mask.defined() ? " masked" : "") +
               (index_order ? " index order" : ""));
  const auto optional_mask = mask.defined() ? c10::optional<torch::Tensor>(mask) : c10::nullopt;
  const auto [scores, indices] = convnn::cpu::knn_select(q, k, top, "gaussian", optional_mask, index_order);
  const auto [expected_scores, expected_indices] =
      emulated_gaussian_select(q.to(torch::kFloat), k.to(torch::kFloat), top, mask, index_order);
  EXPECT_TRUE(torch::equal(indices, expected_indices));
  EXPECT_TRUE(torch::equal(scores, expected_scores.to(q.scalar_type())));
}

// The fused select ranks Gaussian candidates by gaussian_distance bit for bit, however it gets there
// (through the GEMM identity |q|^2 + |k|^2 - 2 q.k, then exactly for the keys near the K-th): random
// rows, whole-row and streamed tiles, masks, near ties (keys a few ulps apart), exact ties
// (duplicated keys), rows with fewer than K valid keys, magnitudes whose squares underflow or
// overflow float32, and bfloat16 and float16 inputs (summed in float32 too).
TEST(FusedSelect, Float32GaussianRanksByTheFeatureOrderSumOfSquaredDifferencesBitForBit) {
  torch::manual_seed(11);
  // Shapes through the identity (1100 keys x 48 features, 800 x 64) and through the direct sums
  // only (197 x 64 and 300 x 17: too few pairs; 2100 x 16: streamed tiles).
  for (const auto& [n, m, d] : {std::make_tuple(int64_t{37}, int64_t{1100}, int64_t{48}),
                                std::make_tuple(int64_t{20}, int64_t{800}, int64_t{64}),
                                std::make_tuple(int64_t{37}, int64_t{197}, int64_t{64}),
                                std::make_tuple(int64_t{70}, int64_t{300}, int64_t{17}),
                                std::make_tuple(int64_t{9}, int64_t{2100}, int64_t{16})}) {
    const auto q = torch::randn({2, n, d}, torch::kFloat), k = torch::randn({2, m, d}, torch::kFloat);
    const auto allowed = torch::rand({n, m}) > 0.4;
    const auto few_allowed = torch::rand({2, n, m}) > 0.997;  // rows with fewer than K valid keys
    // Distances take additive masks of 0 and -inf only (a finite bias has no distance meaning).
    const auto additive = torch::zeros({2, n, m}).masked_fill(torch::rand({2, n, m}) > 0.8, -INFINITY);
    for (const int64_t top : {int64_t{1}, int64_t{8}, int64_t{17}}) {
      expect_emulated_gaussian(q, k, top, {}, top == 8);
      expect_emulated_gaussian(q, k, top, allowed, top != 8);
      expect_emulated_gaussian(q, k, top, additive, false);
      expect_emulated_gaussian(q, k, top, few_allowed, true);
    }
  }
  // Near and exact ties: every key a copy of one of 5 rows, moved by at most 3 ulps.
  const auto base = torch::randn({1, 5, 32}, torch::kFloat);
  auto k = base.index({torch::indexing::Slice(), torch::randint(5, {1030})}).contiguous();
  const auto ulps = torch::randint(-3, 4, k.sizes(), torch::kInt) * (torch::rand(k.sizes()) > 0.7).to(torch::kInt);
  k = torch::nextafter(k, k + ulps.sign().to(torch::kFloat) * INFINITY).where(ulps != 0, k);
  const auto q = base.index({torch::indexing::Slice(), torch::randint(5, {40})}) + 1e-3 * torch::randn({1, 40, 32});
  for (const int64_t top : {int64_t{4}, int64_t{9}, int64_t{16}}) expect_emulated_gaussian(q, k, top, {}, false);
  // Half-precision inputs, converted to float32 rows before either path sums them.
  for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
    expect_emulated_gaussian(torch::randn({2, 30, 48}).to(dtype), torch::randn({2, 1100, 48}).to(dtype), 9, {}, false);
  }
  // Tiny and huge rows: squares below float32's smallest normal, and sums past its largest.
  for (const double scale : {1e-21, 3e18}) {
    const auto small_q = torch::randn({2, 20, 32}, torch::kFloat) * scale;
    const auto small_k = torch::randn({2, 1024, 32}, torch::kFloat) * scale;
    expect_emulated_gaussian(small_q, small_k, 6, {}, false);
  }
}

// Sizes that cover several query and key blocks and ragged block ends.
class FusedSelectShapes : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t>> {};

TEST_P(FusedSelectShapes, EqualsReferenceForEverySimilarityAndSlotOrder) {
  const auto [n, m, d] = GetParam();
  torch::manual_seed(n * 1000 + m);
  const auto q = torch::randn({3, n, d}, torch::kDouble), k = torch::randn({3, m, d}, torch::kDouble);
  for (const auto& similarity : kSimilarities) {
    for (int64_t top : {int64_t{1}, std::min<int64_t>(7, m), m}) {
      for (bool index_order : {false, true}) expect_same_selection(q, k, top, similarity, c10::nullopt, index_order);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, FusedSelectShapes,
                         ::testing::Values(std::make_tuple(1, 1, 1), std::make_tuple(5, 9, 3),
                                           std::make_tuple(70, 300, 17), std::make_tuple(130, 129, 64)));

TEST(FusedSelect, EqualsReferenceWithBoolAdditiveAndPerSliceMasks) {
  torch::manual_seed(3);
  const int64_t g = 2, n = 40, m = 150;
  const auto q = torch::randn({g, n, 8}, torch::kDouble), k = torch::randn({g, m, 8}, torch::kDouble);
  const auto allowed = torch::rand({n, m}) > 0.7;
  const auto per_slice = torch::rand({g, n, m}) > 0.95;  // many rows with fewer than k valid
  const auto additive = torch::zeros({n, m}, torch::kDouble).masked_fill(~allowed, -INFINITY);
  for (const auto& similarity : kSimilarities) {
    expect_same_selection(q, k, 9, similarity, allowed, false);
    expect_same_selection(q, k, 9, similarity, per_slice, true);
    expect_same_selection(q, k, 9, similarity, additive, false);
  }
  const auto bias = torch::randn({g, n, m}, torch::kDouble);  // a finite additive mask (ALiBi-like)
  expect_same_selection(q, k, 5, "dot", bias, false);
}

TEST(FusedSelect, LowerIndexWinsExactTies) {
  // Integer features: many exactly equal scores. Cosine's are rounded, but the same bits in the
  // kernel and the reference (both scale exact dot products by exact norms' inverses, in one order).
  const auto q = torch::randint(-2, 3, {2, 30, 3}, torch::kDouble);
  const auto k = torch::randint(-2, 3, {2, 200, 3}, torch::kDouble);
  for (const auto& similarity : kSimilarities) expect_same_selection(q, k, 10, similarity, c10::nullopt, false);
}

// Float32 with K <= 16 takes the vector-register running top-K (AVX2 builds), K = 17 the scalar
// one. Integer features make every score exact, so the selection must equal the reference's bit
// for bit: exact ties (lower index wins), -0 against +0 (equal, so the index decides), masked
// -inf slots, and row lengths that are not a multiple of the 8-key groups.
TEST(FusedSelect, Float32SmallKTopKEqualsReferenceWithTiesSignedZerosAndMasks) {
  torch::manual_seed(6);
  // M <= 32 ranks whole rows, larger M keeps a running top-K: both sides of the boundary.
  for (const int64_t m : {int64_t{9}, int64_t{16}, int64_t{21}, int64_t{32}, int64_t{33}, int64_t{300}}) {
    const auto q = torch::randint(-2, 3, {2, 37, 3}, torch::kFloat);
    auto k = torch::randint(-2, 3, {2, m, 3}, torch::kFloat);
    k.select(2, 0).mul_(-1);  // -0 next to +0 in the products
    const auto allowed = torch::rand({37, m}) > 0.3;
    for (const int64_t top : {int64_t{1}, int64_t{8}, int64_t{9}, int64_t{16}, int64_t{17}}) {
      if (top > m) continue;
      for (const auto& similarity : {std::string("dot"), std::string("gaussian")}) {
        expect_same_selection(q, k, top, similarity, c10::nullopt, false);
        expect_same_selection(q, k, top, similarity, allowed, true);
      }
    }
  }
}

// Float32 rows of 33 to 2048 keys with K <= 16 are selected whole (AVX2 builds): a gate on the
// K-th largest of 2K..32 lane maxima, then ranks of the keys that pass, or the running top-K when
// more than 32 pass. Integer features (exact scores, many of them equal) reach both: every K (1 to
// 4 lane subsets), rows just above 32 keys and at the 2048-key limit, 2049 keys (the streaming
// tiles), masks and both slot orders; each must equal the reference bit for bit.
TEST(FusedSelect, Float32WholeRowSelectionEqualsReferenceForEveryKUpTo16) {
  torch::manual_seed(7);
  for (const int64_t m : {int64_t{33}, int64_t{40}, int64_t{197}, int64_t{2048}, int64_t{2049}}) {
    const auto q = torch::randint(-8, 9, {2, 37, 4}, torch::kFloat);
    const auto k = torch::randint(-8, 9, {2, m, 4}, torch::kFloat);
    const auto allowed = torch::rand({2, 37, m}) > 0.5;
    for (int64_t top = 1; top <= 16; ++top) {
      for (const auto& similarity : {std::string("dot"), std::string("scaled_dot")}) {
        expect_same_selection(q, k, top, similarity, c10::nullopt, top % 2 == 0);
        expect_same_selection(q, k, top, similarity, allowed, top % 2 == 1);
      }
    }
  }
}

TEST(FusedSelect, Float32ScoresErrNoMoreThanTwiceTheReference) {
  torch::manual_seed(4);
  const auto q64 = torch::randn({4, 50, 32}, torch::kDouble), k64 = torch::randn({4, 180, 32}, torch::kDouble);
  const auto q = q64.to(torch::kFloat), k = k64.to(torch::kFloat);
  for (const auto& similarity : kSimilarities) {
    auto [fused_scores, fused_indices] = convnn::cpu::knn_select(q, k, 8, similarity, c10::nullopt, false);
    auto [ref_scores, ref_indices] = reference_select(q, k, 8, similarity, c10::nullopt, false);
    auto [exact_scores, exact_indices] = reference_select(q64, k64, 8, similarity, c10::nullopt, false);
    SCOPED_TRACE(similarity);
    EXPECT_TRUE(torch::equal(fused_indices, exact_indices));
    const double fused_error = max_abs_diff(fused_scores, exact_scores);
    const double reference_error = max_abs_diff(ref_scores, exact_scores);
    EXPECT_LE(fused_error, 2 * reference_error + 1e-6) << "fused " << fused_error << ", reference " << reference_error;
  }
}

TEST(FusedSelect, HalfPrecisionSelectionIsATopKUpToRounding) {
  torch::manual_seed(5);
  const auto q64 = torch::randn({2, 33, 16}, torch::kDouble), k64 = torch::randn({2, 140, 16}, torch::kDouble);
  for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
    const auto q = q64.to(dtype), k = k64.to(dtype);
    auto [scores, indices] = convnn::cpu::knn_select(q, k, 6, "dot", c10::nullopt, false);
    // Every selected candidate scores (in float64, on the rounded inputs) within rounding of the
    // true 6th best, and the reported scores match the float64 scores of the chosen candidates.
    const auto exact = torch::bmm(q.to(torch::kDouble), k.to(torch::kDouble).transpose(1, 2));
    const auto sixth = std::get<0>(exact.topk(6, -1)).select(-1, 5).unsqueeze(-1);
    const auto chosen = exact.gather(-1, indices);
    const double slack = 8 * convnn::testing::epsilon_of(dtype) * exact.abs().max().item<double>();
    EXPECT_TRUE((chosen >= sixth - slack).all().item<bool>()) << dtype;
    EXPECT_TRUE(AllClose(scores, chosen, slack)) << dtype;
  }
}

TEST(FusedSelect, OverflowingScoreIsRejectedWithItsPosition) {
  // Finite float32 features whose dot product overflows to +inf: the kernel's own check.
  auto q = torch::ones({1, 4, 3});
  q[0][2][1] = 3e38;
  try {
    convnn::cpu::knn_select(q, q, 2, "dot", c10::nullopt, false);
    FAIL() << "expected c10::Error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("must not be NaN or +inf"), std::string::npos);
    EXPECT_NE(std::string(e.what_without_backtrace()).find("[g, i, j] = [0, 2, 2]"), std::string::npos)
        << e.what_without_backtrace();
  }
}

// Key blocks (128 keys) that a bool mask hides from every row of a block of rows (64 rows) are
// skipped once each row holds K candidates, and whole rows (float32, K <= 16, M <= 2048) end at the
// last block any of their rows may select. Integer features, so every score is exact and the
// selection must be the reference's bit for bit: causal masks (rows with fewer than K valid keys
// first), windows far from the first keys (short rows filled by the lowest masked indices, which
// the first block holds), K above a block's width (the second block read even where hidden),
// per-slice masks, whole rows and streamed ones, and float64 (whose kernel streams at every length).
TEST(FusedSelect, KeyBlocksABoolMaskHidesFromEveryRowChangeNothing) {
  torch::manual_seed(8);
  const int64_t n = 300;
  for (const int64_t m : {int64_t{1500}, int64_t{2200}}) {
    const auto rows = torch::arange(n).unsqueeze(1), keys = torch::arange(m).unsqueeze(0);
    const auto causal = keys <= rows + (m - n);  // every row's diagonal near the last keys
    const auto early_causal = keys <= rows;       // rows 0 .. K-2 short; keys past row 299 hidden from all
    const auto window_start = 1000 + (rows % 3) * 128;
    const auto windows = (keys >= window_start) & (keys < window_start + (rows % 5));  // 0 to 4 valid keys
    const auto per_slice = torch::stack({early_causal, windows});
    const auto none = torch::zeros({n, m}, torch::kBool);  // every row short of K: slots 0 .. K-1
    for (const auto dtype : {torch::kFloat, torch::kDouble}) {
      const auto q = torch::randint(-3, 4, {2, n, 4}, dtype), k = torch::randint(-3, 4, {2, m, 4}, dtype);
      for (const int64_t top : {int64_t{1}, int64_t{9}, int64_t{16}, int64_t{17}, int64_t{200}}) {
        for (const auto& similarity : {std::string("dot"), std::string("gaussian")}) {
          for (const auto& mask : {causal, early_causal, windows, per_slice, none}) {
            SCOPED_TRACE(std::string(c10::toString(dtype)) + " m=" + std::to_string(m));
            expect_same_selection(q, k, top, similarity, mask, top == 9);
          }
        }
      }
    }
  }
}

TEST(FusedSelect, SameResultWithOneOrTwoThreads) {
  torch::manual_seed(6);
  const auto q = torch::randn({5, 90, 12}), k = torch::randn({5, 260, 12});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  auto [scores_one, indices_one] = convnn::cpu::knn_select(q, k, 9, "cosine", c10::nullopt, false);
  at::set_num_threads(2);
  auto [scores_two, indices_two] = convnn::cpu::knn_select(q, k, 9, "cosine", c10::nullopt, false);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(indices_one, indices_two));
  EXPECT_TRUE(torch::equal(scores_one, scores_two));
}

TEST(FusedSelect, NonContiguousInputsAndEmptyBatch) {
  const auto q = torch::randn({3, 8, 20}, torch::kDouble).transpose(1, 2);  // [3,20,8] strided
  const auto k = torch::randn({3, 8, 30}, torch::kDouble).transpose(1, 2);
  expect_same_selection(q, k, 4, "dot", c10::nullopt, false);
  auto [scores, indices] = convnn::cpu::knn_select(torch::randn({0, 5, 3}), torch::randn({0, 6, 3}), 2, "dot",
                                                   c10::nullopt, false);
  EXPECT_EQ(scores.sizes(), (std::vector<int64_t>{0, 5, 2}));
}

}  // namespace

}  // namespace knn_select_fused_test
