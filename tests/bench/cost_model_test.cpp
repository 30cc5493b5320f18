// The FLOP and byte rules of docs/benchmarks.md, checked on one small shape by hand.
#include "convnn/bench/cost_model.h"

#include <gtest/gtest.h>

namespace {

using namespace convnn::bench;

TEST(CostModel, OpLevelDepthwiseRules) {
  // G = 2 * 3 = 6 slices, N = M = 10, d = 12 / 3 = 4, K = 5, float32, scaled_dot.
  const CostShape shape{2, 10, 12, 3, 5, true, 4, true};
  const auto model = convnn_op_cost(shape);
  const double g = 6, n = 10, d = 4, k = 5;
  const double rest = 4 * g * n * k + g * n * k * d + 2 * g * n * k * d;  // softmax, weighting, aggregation
  const double forward = 2 * g * n * n * d + g * n * n + rest;
  const double backward = 4 * g * n * k * d + g * n * k + 2 * rest;
  EXPECT_DOUBLE_EQ(model.forward.flops, forward);
  EXPECT_DOUBLE_EQ(model.backward.flops, backward);
  EXPECT_DOUBLE_EQ(model.forward_backward.flops, forward + backward);
  // Forward: read q, k, v and the kernel, write the output.
  EXPECT_DOUBLE_EQ(model.forward.bytes, 4 * (3 * g * n * d + d * k + g * n * d));
  // Backward: read dy, q, k, v, kernel; write dq, dk, dv, dkernel.
  EXPECT_DOUBLE_EQ(model.backward.bytes, 4 * (g * n * d + 2 * (3 * g * n * d + d * k)));
}

TEST(CostModel, DotSimilarityHasNoScale) {
  const CostShape scaled{2, 10, 12, 3, 5, true, 4, true};
  CostShape dot = scaled;
  dot.scaled = false;
  EXPECT_DOUBLE_EQ(convnn_op_cost(scaled).forward.flops - convnn_op_cost(dot).forward.flops, 6.0 * 10 * 10);
}

TEST(CostModel, ModuleAddsFourProjectionsAndMhsaIsDense) {
  const CostShape shape{2, 10, 12, 3, 5, false, 8, true};
  const double b = 2, n = 10, c = 12, g = 6, d = 4;
  const double projections = 4 * 2 * b * n * c * c;
  EXPECT_DOUBLE_EQ(convnn_module_cost(shape).forward.flops - convnn_op_cost(shape).forward.flops, projections);
  EXPECT_DOUBLE_EQ(mhsa_module_cost(shape).forward.flops,
                   projections + 2 * g * n * n * d + g * n * n + 4 * g * n * n + 2 * g * n * n * d);
  EXPECT_DOUBLE_EQ(mhsa_module_cost(shape).forward.flops - mhsa_op_cost(shape).forward.flops, projections);
  // The op level reads q, k, v and writes the output; no weights.
  EXPECT_DOUBLE_EQ(mhsa_op_cost(shape).forward.bytes, 8 * (3 * g * n * d + g * n * d));
}

TEST(CostModel, RooflineFloorIsTheSlowerCeiling) {
  const MachinePeaks peaks{1e9, 1e8, 0, 0};
  EXPECT_DOUBLE_EQ(roofline_floor_s({2e9, 1e8}, peaks), 2.0);
  EXPECT_DOUBLE_EQ(roofline_floor_s({1e8, 5e8}, peaks), 5.0);
}

}  // namespace
