// Basic contract of the two core ops through the dispatcher: shapes, dtypes and autograd wiring.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "convnn/ops/knn_ops.h"
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

}  // namespace
