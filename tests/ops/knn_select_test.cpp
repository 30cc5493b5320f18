// knn_select against a brute-force float64 computation written straight from the definitions in
// convnn/ops/similarity.h: every similarity, both slot orders, masks, ties and the NaN rule.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "convnn/nn/functional/convnn.h"
#include "convnn/ops/knn_ops.h"
#include "convnn/ops/similarity.h"
#include "support/assert_close.h"
#include "support/enum_lists.h"

namespace knn_select_test {  // apart from the files of its unity batch (tests/CMakeLists.txt)

namespace {

using convnn::Similarity;
using convnn::testing::AllClose;
using convnn::testing::epsilon_of;

constexpr double kInf = std::numeric_limits<double>::infinity();

at::Tensor randn(c10::IntArrayRef shape, uint64_t seed, at::ScalarType dtype = at::kDouble) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, generator, at::TensorOptions().dtype(dtype));
}

// Bool mask with roughly `p_valid` of the candidates allowed.
at::Tensor random_bool_mask(c10::IntArrayRef shape, double p_valid, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::rand(shape, generator, at::TensorOptions().dtype(at::kDouble)) < p_valid;
}

at::Tensor additive(const at::Tensor& allowed) {
  return at::where(allowed, at::scalar_tensor(0.0, at::kDouble),
                   at::scalar_tensor(-kInf, at::kDouble));
}

c10::optional<at::Tensor> optional(const at::Tensor& t) {
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

// Ranking key of one pair (larger = more similar): the similarity itself, or -distance.
double ranking_key(const double* q, const double* k, int64_t d, Similarity s) {
  double dot = 0, qq = 0, kk = 0, squared = 0, largest = 0, manhattan = 0;
  for (int64_t c = 0; c < d; ++c) {
    dot += q[c] * k[c];
    qq += q[c] * q[c];
    kk += k[c] * k[c];
    squared += (q[c] - k[c]) * (q[c] - k[c]);
    largest = std::max(largest, std::abs(q[c] - k[c]));
    manhattan += std::abs(q[c] - k[c]);
  }
  switch (s) {
    case Similarity::Dot:
      return dot;
    case Similarity::ScaledDot:
      return dot / std::sqrt(static_cast<double>(d));
    case Similarity::Cosine:
      return dot / (std::max(std::sqrt(qq), convnn::kCosineEps) *
                    std::max(std::sqrt(kk), convnn::kCosineEps));
    case Similarity::Gaussian:
      return -squared;
    case Similarity::Chebyshev:
      return -largest;
    case Similarity::L1:
      return -manhattan;
  }
  return 0;
}

double reported_score(double key, Similarity s) {
  if (key == -kInf || !convnn::is_distance_similarity(s)) return key;
  return std::exp(key);
}

struct Selection {
  at::Tensor scores, indices;
};

// Full sort of every row by descending key, lower index first among equals.
Selection brute_force_select(const at::Tensor& queries, const at::Tensor& keys, int64_t k,
                             Similarity s, const at::Tensor& mask, bool index_order) {
  const auto q = queries.to(at::kDouble).contiguous();
  const auto kc = keys.to(at::kDouble).contiguous();
  const int64_t g = q.size(0), n = q.size(1), m = kc.size(1), d = q.size(2);
  at::Tensor offsets = at::zeros({g, n, m}, at::kDouble);
  if (mask.defined()) {
    offsets = (mask.scalar_type() == at::kBool ? additive(mask) : mask.to(at::kDouble))
                  .expand({g, n, m})
                  .contiguous();
  }
  const auto offset = offsets.accessor<double, 3>();
  Selection out{at::empty({g, n, k}, at::kDouble), at::empty({g, n, k}, at::kLong)};
  auto scores = out.scores.accessor<double, 3>();
  auto indices = out.indices.accessor<int64_t, 3>();
  for (int64_t b = 0; b < g; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      std::vector<double> key(m);
      for (int64_t j = 0; j < m; ++j) {
        key[j] = ranking_key(q.data_ptr<double>() + (b * n + i) * d,
                             kc.data_ptr<double>() + (b * m + j) * d, d, s) +
                 offset[b][i][j];
      }
      std::vector<int64_t> order(m);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t c) { return key[a] > key[c]; });
      order.resize(k);
      if (index_order) std::sort(order.begin(), order.end());
      for (int64_t slot = 0; slot < k; ++slot) {
        indices[b][i][slot] = order[slot];
        scores[b][i][slot] = reported_score(key[order[slot]], s);
      }
    }
  }
  return out;
}

at::Tensor bool_mask(const std::vector<int64_t>& allowed) {
  return at::tensor(allowed, at::kLong).to(at::kBool).view({1, -1});
}

at::Tensor finite_part(const at::Tensor& t) {
  return at::where(at::isneginf(t), at::zeros_like(t), t);
}

// Indices exactly; scores within a few ulps of dtype per feature (the order of the sums differs).
::testing::AssertionResult SelectionsMatch(const Selection& actual, const Selection& expected,
                                           at::ScalarType dtype, int64_t d) {
  if (!at::equal(actual.indices, expected.indices)) {
    return ::testing::AssertionFailure() << "indices differ:\n"
                                         << actual.indices << "\nexpected\n"
                                         << expected.indices;
  }
  if (!at::equal(at::isneginf(actual.scores), at::isneginf(expected.scores))) {
    return ::testing::AssertionFailure() << "-inf (masked) slots differ";
  }
  const double tolerance = 16.0 * static_cast<double>(d) * epsilon_of(dtype);
  return AllClose(finite_part(actual.scores), finite_part(expected.scores), tolerance, tolerance);
}

::testing::AssertionResult SelectMatchesBruteForce(const at::Tensor& queries,
                                                   const at::Tensor& keys, int64_t k, Similarity s,
                                                   const at::Tensor& mask, bool index_order) {
  auto [scores, indices] =
      convnn::ops::knn_select(queries, keys, k, convnn::to_string(s), optional(mask), index_order);
  return SelectionsMatch({scores, indices},
                         brute_force_select(queries, keys, k, s, mask, index_order),
                         queries.scalar_type(), queries.size(2));
}

class KnnSelectSimilarity : public ::testing::TestWithParam<Similarity> {};

TEST_P(KnnSelectSimilarity, MatchesFloat64BruteForceInScoreAndIndexOrder) {
  const auto q = randn({2, 5, 3}, 1), k = randn({2, 7, 3}, 2);
  for (const int64_t top : {1, 3, 7}) {
    for (const bool index_order : {false, true}) {
      EXPECT_TRUE(SelectMatchesBruteForce(q, k, top, GetParam(), {}, index_order))
          << "k = " << top << ", index_order = " << index_order;
    }
  }
}

TEST_P(KnnSelectSimilarity, SelfKeysMatchBruteForce) {
  const auto x = randn({3, 6, 4}, 3);
  EXPECT_TRUE(SelectMatchesBruteForce(x, x, 4, GetParam(), {}, false));
}

TEST_P(KnnSelectSimilarity, Float32ScoresAreWithinFloat32EpsilonOfFloat64BruteForce) {
  const auto q = randn({2, 5, 3}, 4, at::kFloat), k = randn({2, 7, 3}, 5, at::kFloat);
  EXPECT_TRUE(SelectMatchesBruteForce(q, k, 3, GetParam(), {}, false));
}

TEST_P(KnnSelectSimilarity, BoolAndAdditiveMasksOfShapeNMAndGNMMatchBruteForce) {
  const auto q = randn({2, 5, 3}, 6), k = randn({2, 7, 3}, 7);
  auto per_slice = random_bool_mask({2, 5, 7}, 0.6, 8);
  per_slice[0][1].fill_(false);  // no valid candidate at all
  per_slice[1][2].fill_(false);  // a single valid candidate, fewer than k
  per_slice[1][2][4] = true;
  const auto shared = per_slice[0].clone();  // [N,M]
  for (const auto& mask : {per_slice, shared, additive(per_slice), additive(shared)}) {
    for (const bool index_order : {false, true}) {
      EXPECT_TRUE(SelectMatchesBruteForce(q, k, 3, GetParam(), mask, index_order))
          << "mask " << mask.sizes() << " " << mask.scalar_type()
          << ", index_order = " << index_order;
    }
  }
}

TEST_P(KnnSelectSimilarity, AdditiveZeroMinusInfMaskEqualsBoolMask) {
  const auto q = randn({2, 4, 3}, 9), k = randn({2, 6, 3}, 10);
  const auto mask = random_bool_mask({2, 4, 6}, 0.5, 11);
  const auto name = convnn::to_string(GetParam());
  auto [s_bool, i_bool] = convnn::ops::knn_select(q, k, 3, name, mask, false);
  auto [s_add, i_add] = convnn::ops::knn_select(q, k, 3, name, additive(mask), false);
  EXPECT_TRUE(at::equal(i_bool, i_add));
  EXPECT_TRUE(at::equal(s_bool, s_add));
}

INSTANTIATE_TEST_SUITE_P(KnnSelect, KnnSelectSimilarity,
                         ::testing::ValuesIn(convnn::testing::all_similarities()),
                         [](const auto& info) {
                           return std::string(convnn::to_string(info.param));
                         });

// [1,1,D] queries and [1,M,D] keys from nested lists.
at::Tensor rows(const std::vector<std::vector<double>>& values) {
  const int64_t m = static_cast<int64_t>(values.size()), d = static_cast<int64_t>(values[0].size());
  auto t = at::empty({1, m, d}, at::kDouble);
  for (int64_t j = 0; j < m; ++j) {
    for (int64_t c = 0; c < d; ++c) t[0][j][c] = values[j][c];
  }
  return t;
}

std::vector<int64_t> selected(const at::Tensor& q, const at::Tensor& k, int64_t top,
                              const std::string& similarity) {
  const auto indices =
      std::get<1>(convnn::ops::knn_select(q, k, top, similarity, c10::nullopt, false));
  const auto flat = indices.reshape({-1}).contiguous();
  return {flat.data_ptr<int64_t>(), flat.data_ptr<int64_t>() + flat.numel()};
}

using Indices = std::vector<int64_t>;

TEST(KnnSelect, LowerIndexWinsTies) {
  // Keys 2, 5 and 6 are identical and best; k = 2 cuts through the tie.
  const auto q = rows({{1, 1}});
  const auto k = rows({{0, 0}, {1, 0}, {3, 3}, {0, 1}, {1, 1}, {3, 3}, {3, 3}});
  EXPECT_EQ(selected(q, k, 2, "dot"), (Indices{2, 5}));
  EXPECT_EQ(selected(q, k, 4, "dot"), (Indices{2, 5, 6, 4}));
  EXPECT_EQ(selected(q, k, 2, "scaled_dot"), (Indices{2, 5}));
}

TEST(KnnSelect, GaussianMirrorNeighboursTieAndTheLowerIndexComesFirst) {
  const auto q = rows({{2}});
  const auto k = rows({{0}, {1}, {2}, {3}, {4}});
  EXPECT_EQ(selected(q, k, 5, "gaussian"), (Indices{2, 1, 3, 0, 4}));
}

TEST(KnnSelect, L1RanksByManhattanDistanceAndReportsItsExponential) {
  // |q - k|_1 from q = (0, 0): 3, 3 and 1. The tie at 3 goes to the lower index.
  const auto q = rows({{0, 0}});
  const auto k = rows({{1, 2}, {3, 0}, {0.5, 0.5}});
  const auto [scores, indices] = convnn::ops::knn_select(q, k, 2, "l1", c10::nullopt, false);
  EXPECT_EQ(indices.flatten()[0].item<int64_t>(), 2);
  EXPECT_EQ(indices.flatten()[1].item<int64_t>(), 0);
  EXPECT_DOUBLE_EQ(scores.flatten()[0].item<double>(), std::exp(-1.0));
  EXPECT_DOUBLE_EQ(scores.flatten()[1].item<double>(), std::exp(-3.0));
}

TEST(KnnSelect, ChebyshevTiesAroundAGridPointResolveByIndex) {
  std::vector<std::vector<double>> grid;
  for (int y = 0; y < 3; ++y) {
    for (int x = 0; x < 3; ++x) grid.push_back({double(y), double(x)});
  }
  EXPECT_EQ(selected(rows({{1, 1}}), rows(grid), 9, "chebyshev"),
            (Indices{4, 0, 1, 2, 3, 5, 6, 7, 8}));
}

TEST(KnnSelect, CosineTieBetweenParallelKeysGoesToTheLowerIndex) {
  // Scaling a row by a power of two scales its dot product and its norm exactly, so the cosines
  // tie exactly.
  const auto q = rows({{1, 2, 3}});
  const auto k = rows({{-1, 0, 0}, {2, 4, 6}, {0, 1, 0}, {1, 2, 3}, {0.5, 1, 1.5}});
  EXPECT_EQ(selected(q, k, 3, "cosine"), (Indices{1, 3, 4}));
}

TEST(KnnSelect, MaskedTiesResolveToTheLowestMaskedIndex) {
  const auto q = rows({{1}});
  const auto k = rows({{5}, {4}, {3}, {2}});
  auto mask = bool_mask({0, 1, 0, 0});
  auto [scores, indices] = convnn::ops::knn_select(q, k, 3, "dot", mask, false);
  EXPECT_TRUE(at::equal(indices, at::tensor({1, 0, 2}, at::kLong).view({1, 1, 3})));
  EXPECT_EQ(scores[0][0][0].item<double>(), 4.0);
  EXPECT_TRUE(at::isneginf(scores.narrow(-1, 1, 2)).all().item<bool>());
}

TEST(KnnSelect, IndexOrderSortsSlotsByIndexAndKeepsEachScoreWithItsIndex) {
  const auto q = randn({2, 5, 3}, 12), k = randn({2, 8, 3}, 13);
  auto [s_score, i_score] = convnn::ops::knn_select(q, k, 4, "cosine", c10::nullopt, false);
  auto [s_index, i_index] = convnn::ops::knn_select(q, k, 4, "cosine", c10::nullopt, true);
  EXPECT_TRUE(at::equal(std::get<0>(i_score.sort(-1)), i_index));
  EXPECT_TRUE((i_index.diff(1, -1) > 0).all().item<bool>());
  EXPECT_TRUE((s_score.diff(1, -1) <= 0).all().item<bool>());
  const auto permutation = std::get<1>(i_score.sort(-1));
  EXPECT_TRUE(at::equal(s_score.gather(-1, permutation), s_index));
}

TEST(KnnSelect, MaskedCandidatesAreNeverChosenWhileValidOnesRemain) {
  const auto q = randn({2, 6, 3}, 14), k = randn({2, 9, 3}, 15);
  const auto mask = random_bool_mask({2, 6, 9}, 0.5, 16);
  const int64_t top = 3;
  auto [scores, indices] = convnn::ops::knn_select(q, k, top, "dot", mask, false);
  const auto chosen_valid = mask.gather(-1, indices);
  const auto valid_count = mask.sum(-1, /*keepdim=*/true);
  const auto slot = at::arange(top, at::kLong).view({1, 1, top});
  // Slot s is valid exactly when the row has more than s valid candidates.
  EXPECT_TRUE(at::equal(chosen_valid, slot < valid_count));
  EXPECT_TRUE(at::equal(at::isneginf(scores), ~chosen_valid));
}

TEST(KnnSelect, MinusInfSlotsWeighExactlyZeroUnderEveryRho) {
  const auto scores = at::tensor({0.3, -kInf, 1.2, -kInf}, at::kDouble).view({1, 1, 4});
  using convnn::nn::Rho;
  for (const auto rho : {Rho::Uniform, Rho::Mean, Rho::Softmax}) {
    const auto w = convnn::nn::functional::rho_weights(scores, rho, 0.7);
    EXPECT_EQ(w[0][0][1].item<double>(), 0.0) << convnn::nn::to_string(rho);
    EXPECT_EQ(w[0][0][3].item<double>(), 0.0) << convnn::nn::to_string(rho);
    EXPECT_GT(w[0][0][0].item<double>(), 0.0) << convnn::nn::to_string(rho);
  }
  const auto none_valid = at::full({1, 1, 3}, -kInf, at::kDouble);
  EXPECT_TRUE(at::equal(convnn::nn::functional::rho_weights(none_valid, Rho::Softmax),
                        at::zeros_like(none_valid)));
}

TEST(KnnSelect, AggregationIgnoresTheValuesBehindMaskedSlots) {
  // One query with 2 valid of 6 candidates and k = 4: two slots are masked. Changing the values
  // of the masked candidates must not change the output at all.
  const auto q = randn({1, 1, 3}, 17), k = randn({1, 6, 3}, 18);
  const auto mask = bool_mask({0, 1, 0, 0, 1, 0});
  auto [scores, indices] = convnn::ops::knn_select(q, k, 4, "cosine", mask, false);
  ASSERT_EQ(at::isneginf(scores).sum().item<int64_t>(), 2);
  const auto kernel = randn({5, 2, 4}, 19);
  const auto values = randn({1, 6, 2}, 20);
  auto changed = values.clone();
  changed.index_put_({0, ~mask[0]}, 1e6);
  using convnn::nn::Rho;
  for (const auto rho : {Rho::Uniform, Rho::Mean, Rho::Softmax}) {
    const auto w = convnn::nn::functional::rho_weights(scores, rho);
    EXPECT_TRUE(at::equal(convnn::ops::knn_aggregate(values, w, indices, kernel, c10::nullopt),
                          convnn::ops::knn_aggregate(changed, w, indices, kernel, c10::nullopt)))
        << convnn::nn::to_string(rho);
  }
}

// Runs knn_select and returns the message of the c10::Error it throws ("" if none).
std::string select_error(const at::Tensor& q, const at::Tensor& k, const std::string& similarity,
                         const c10::optional<at::Tensor>& mask = c10::nullopt) {
  try {
    convnn::ops::knn_select(q, k, 1, similarity, mask, false);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

TEST(KnnSelect, NanOrInfQueryRaisesAnErrorNamingItsPosition) {
  // A +inf query under gaussian once gave every candidate the ranking key -inf, which reads as
  // "masked": the row silently output the bias. Non-finite inputs are refused instead.
  for (const double bad : {std::nan(""), kInf, -kInf}) {
    auto q = randn({2, 4, 3}, 21);
    const auto k = randn({2, 5, 3}, 22);
    q[1][2][0] = bad;
    for (const auto& similarity : convnn::similarity_names()) {
      const auto message = select_error(q, k, similarity);
      EXPECT_NE(message.find("queries must be finite"), std::string::npos)
          << similarity << ": " << message;
      EXPECT_NE(message.find("at position [1, 2, 0]"), std::string::npos)
          << similarity << ": " << message;
    }
  }
}

TEST(KnnSelect, PlusInfSimilarityRaisesAnErrorNamingItsPosition) {
  // Only the pair (query 0, key 3) overflows to +inf.
  const auto q = rows({{1e200, 0}});
  const auto k = rows({{1, 0}, {2, 0}, {3, 1}, {1e200, 0}, {-1, 0}});
  const auto message = select_error(q, k, "dot");
  EXPECT_NE(message.find("[g, i, j] = [0, 0, 3]"), std::string::npos) << message;
  // A +inf entry of an additive mask is just as unrankable.
  auto mask = at::zeros({1, 5}, at::kDouble);
  mask[0][2] = kInf;
  const auto mask_message = select_error(rows({{1, 0}}), k, "dot", mask);
  EXPECT_NE(mask_message.find("[g, i, j] = [0, 0, 2]"), std::string::npos) << mask_message;
}

}  // namespace

}  // namespace knn_select_test
