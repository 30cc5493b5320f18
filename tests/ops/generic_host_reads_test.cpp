// The generic path as an accelerator runs it by default: no value is read back to the host, so a
// NaN or +inf that makes a query row unrankable turns that row's outputs NaN on the device instead
// of raising (docs/operator.md, "Host reads"). ctest runs this suite with
// CONVNN_DEVICE_VALUE_CHECKS=0, which makes the CPU read no values either.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <limits>
#include <string_view>
#include <tuple>

#include "ops/generic/generic.h"

namespace {

namespace generic = convnn::ops::generic;

bool reads_no_values() {
  const char* value = std::getenv("CONVNN_DEVICE_VALUE_CHECKS");
  return value != nullptr && std::string_view(value) == "0";
}

struct Inputs {
  torch::Tensor q, k, v, kernel;
};

Inputs inputs() {
  torch::manual_seed(8);
  return {torch::randn({2, 5, 3}), torch::randn({2, 6, 3}), torch::randn({2, 6, 4}), torch::ones({4, 3})};
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> attention(const Inputs& in) {
  return generic::knn_attention(in.q, in.k, in.v, in.kernel, c10::nullopt, 3, "dot", c10::nullopt,
                                false, "softmax", 1.0);
}

// Rows of [G,N,...] that hold a NaN.
torch::Tensor nan_rows(const torch::Tensor& t) { return t.isnan().flatten(2).any(-1); }

TEST(GenericWithoutHostReads, ANanQueryMakesItsOwnRowNanAndLeavesTheOthersExact) {
  if (!reads_no_values()) GTEST_SKIP() << "ctest runs this with CONVNN_DEVICE_VALUE_CHECKS=0";
  const auto clean = inputs();
  auto poisoned = clean;
  poisoned.q = clean.q.clone();
  poisoned.q[1][2][0] = std::numeric_limits<float>::quiet_NaN();
  const auto [out, scores, indices, weights] = attention(poisoned);
  const auto [clean_out, clean_scores, clean_indices, clean_weights] = attention(clean);
  auto expected = torch::zeros({2, 5}, torch::kBool);
  expected[1][2] = true;
  for (const auto& t : {out, scores, weights}) EXPECT_TRUE(torch::equal(nan_rows(t), expected));
  const auto others = expected.logical_not();
  EXPECT_TRUE(torch::equal(out.index({others}), clean_out.index({others})));
  EXPECT_TRUE(torch::equal(indices.index({others}), clean_indices.index({others})));
}

// With dot similarity an infinite key coordinate scores +inf against the queries whose coordinate
// is positive (unrankable: those rows turn NaN) and -inf against the others (as if masked).
TEST(GenericWithoutHostReads, AnInfiniteKeyMakesTheRowsItScoresPlusInfNan) {
  if (!reads_no_values()) GTEST_SKIP() << "ctest runs this with CONVNN_DEVICE_VALUE_CHECKS=0";
  auto in = inputs();
  in.k[0][4][1] = std::numeric_limits<float>::infinity();
  auto expected = torch::zeros({2, 5}, torch::kBool);
  expected[0].copy_(in.q[0].select(1, 1) > 0);
  ASSERT_TRUE(expected.any().item<bool>() && !expected.all().item<bool>()) << "the test needs both kinds of row";
  const auto [scores, indices] = generic::knn_select(in.q, in.k, 3, "dot", c10::nullopt, false);
  EXPECT_TRUE(torch::equal(nan_rows(scores), expected));
  EXPECT_TRUE(torch::equal(nan_rows(std::get<0>(attention(in))), expected));
}

}  // namespace
