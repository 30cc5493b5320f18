// Basic contract of the two core ops through the dispatcher: shapes, dtypes and autograd wiring.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "convnn/ops/knn_ops.h"
#include "convnn/ops/rho.h"
#include "convnn/ops/similarity.h"
#include "support/gradcheck.h"

namespace {

TEST(KnnSelect, ReturnsScoresAndInt64IndicesOfShapeGNK) {
  const auto q = torch::randn({2, 5, 3});
  auto [scores, indices] = convnn::ops::knn_select(q, q, 4, "dot", c10::nullopt, false);
  EXPECT_EQ(scores.sizes(), (std::vector<int64_t>{2, 5, 4}));
  EXPECT_EQ(indices.sizes(), (std::vector<int64_t>{2, 5, 4}));
  EXPECT_EQ(indices.scalar_type(), torch::kLong);
}

TEST(KnnAggregate, GradCheckThroughDispatcherInFloat64) {
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  const auto values = torch::randn({2, 6, 3}, opts).requires_grad_();
  const auto weights = torch::randn({2, 4, 2}, opts).requires_grad_();
  const auto kernel = torch::randn({5, 3, 2}, opts).requires_grad_();
  const auto bias = torch::randn({5}, opts).requires_grad_();
  const auto indices = torch::randint(0, 6, {2, 4, 2}, torch::kLong);
  EXPECT_TRUE(convnn::testing::GradCheck(
      [&](const std::vector<torch::Tensor>& x) {
        return convnn::ops::knn_aggregate(x[0], x[1], indices, x[2], x[3]);
      },
      {values, weights, kernel, bias}));
}

TEST(EnumNames, EverySimilarityAndRhoIsNamedInEnumOrderAndParsesBack) {
  const auto& similarities = convnn::similarity_names();
  ASSERT_EQ(static_cast<int>(similarities.size()), convnn::kSimilarityCount);
  for (int value = 0; value < convnn::kSimilarityCount; ++value) {
    const auto similarity = static_cast<convnn::Similarity>(value);
    EXPECT_EQ(similarities[value], convnn::to_string(similarity));
    EXPECT_EQ(convnn::parse_similarity(similarities[value]), similarity);
  }
  const auto& rhos = convnn::rho_names();
  ASSERT_EQ(static_cast<int>(rhos.size()), convnn::kRhoCount);
  for (int value = 0; value < convnn::kRhoCount; ++value) {
    EXPECT_EQ(convnn::parse_rho(rhos[value]), static_cast<convnn::Rho>(value));
  }
  EXPECT_TRUE(convnn::is_distance_similarity(convnn::Similarity::L1));
  EXPECT_FALSE(convnn::is_distance_similarity(convnn::Similarity::Cosine));
  EXPECT_TRUE(convnn::rho_has_score_gradient(convnn::Rho::Softmax));
  EXPECT_FALSE(convnn::rho_has_score_gradient(convnn::Rho::Mean));
}

}  // namespace
