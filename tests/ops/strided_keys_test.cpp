// The fused CPU select reads keys whose slices are each dense but lie further apart (a slice of a
// longer buffer, as a head-major key/value cache gives: keys_slice_stride) in place, and gives
// bitwise what it gives on a contiguous copy: the kernel reads the same values in the same order.
// Every similarity, through knn_select and the fused knn_attention, with and without a mask, and
// a key layout whose rows are not dense (copied, with the same results).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "convnn/ops/knn_ops.h"
#include "convnn/ops/similarity.h"

namespace {

class StridedKeys : public ::testing::TestWithParam<std::string> {};

TEST_P(StridedKeys, ASliceOfALongerBufferSelectsAndAggregatesAsItsContiguousCopy) {
  torch::manual_seed(0);
  const int64_t g = 3, n = 5, m = 37, capacity = 64, d = 16, k = 4;
  const auto q = torch::randn({g, n, d});
  const auto buffer = torch::randn({g, capacity, d});
  const auto keys = buffer.narrow(1, 0, m);  // slice stride capacity * d, rows dense
  ASSERT_FALSE(keys.is_contiguous());
  const auto values = torch::randn({g, capacity, d}).narrow(1, 0, m);
  const auto kernel = torch::randn({d, k});
  const auto mask = torch::rand({n, m}) < 0.8;
  const auto& similarity = GetParam();
  for (const bool masked : {false, true}) {
    const auto mask_arg = masked ? c10::optional<torch::Tensor>(mask) : c10::nullopt;
    const auto [scores, indices] = convnn::ops::knn_select(q, keys, k, similarity, mask_arg, false);
    const auto [dense_scores, dense_indices] = convnn::ops::knn_select(q, keys.contiguous(), k, similarity, mask_arg, false);
    EXPECT_TRUE(torch::equal(indices, dense_indices)) << similarity << (masked ? " masked" : "");
    EXPECT_TRUE(torch::equal(scores, dense_scores)) << similarity << (masked ? " masked" : "");
    const auto fused = convnn::ops::knn_attention(q, keys, values, kernel, c10::nullopt, k, similarity, mask_arg,
                                                  false, "softmax", 1.0);
    const auto dense = convnn::ops::knn_attention(q, keys.contiguous(), values.contiguous(), kernel, c10::nullopt, k,
                                                  similarity, mask_arg, false, "softmax", 1.0);
    EXPECT_TRUE(torch::equal(std::get<0>(fused), std::get<0>(dense))) << similarity << (masked ? " masked" : "");
    EXPECT_TRUE(torch::equal(std::get<2>(fused), std::get<2>(dense))) << similarity << (masked ? " masked" : "");
  }
  // Rows that are not dense (every other row of the buffer) are copied first: the same results.
  const auto sparse_rows = buffer.slice(1, 0, 2 * m, 2);
  const auto [scores, indices] = convnn::ops::knn_select(q, sparse_rows, k, similarity, c10::nullopt, false);
  const auto [dense_scores, dense_indices] =
      convnn::ops::knn_select(q, sparse_rows.contiguous(), k, similarity, c10::nullopt, false);
  EXPECT_TRUE(torch::equal(indices, dense_indices)) << similarity;
  EXPECT_TRUE(torch::equal(scores, dense_scores)) << similarity;
}

INSTANTIATE_TEST_SUITE_P(EverySimilarity, StridedKeys, ::testing::ValuesIn(convnn::similarity_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
