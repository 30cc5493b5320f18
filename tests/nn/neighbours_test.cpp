// What the layers return as their neighbours is what they aggregated: the output recomputed from
// the returned indices and weights is the layer's output, and in the convolution case the
// positions are the convolution's window (with stride and dilation too).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "convnn/nn/modules/convnn.h"
#include "convnn/nn/neighbours.h"
#include "support/assert_close.h"
#include "support/error_message.h"

namespace neighbours_test {  // apart from the files of its unity batch (tests/CMakeLists.txt)

namespace {

using namespace convnn::nn;
using convnn::Similarity;
using convnn::testing::AllClose;

using convnn::testing::error_of;

// The spatial layer's output [B, C', *] recomputed from its input (identity projections), the
// returned indices (flat in the padded grid) and weights, and its kernel shared by the heads.
torch::Tensor aggregate_from(const torch::Tensor& x, int64_t padding, const Neighbours& n, const torch::Tensor& kernel) {
  const auto padded = torch::constant_pad_nd(x, std::vector<int64_t>(2 * (x.dim() - 2), padding));
  const int64_t batch = x.size(0), channels = x.size(1), heads = n.indices.size(1), queries = n.indices.size(2),
                k = n.indices.size(3), per_head = channels / heads;
  const auto tokens = padded.flatten(2).view({batch, heads, per_head, 1, -1}).expand({-1, -1, -1, queries, -1});
  const auto index = n.indices.unsqueeze(2).expand({-1, -1, per_head, -1, -1});  // [B,H,d,Q,K]
  const auto weighted = tokens.gather(-1, index) * n.weights.unsqueeze(2);
  const auto out = kernel.dim() == 2 ? torch::einsum("bhcqk,ck->bhcq", {weighted, kernel})
                                     : torch::einsum("bhcqk,ock->bhoq", {weighted, kernel});
  return out.reshape({batch, -1, queries});
}

template <typename Layer>
void expect_recorded_neighbours_reproduce_the_output(Layer layer, const torch::Tensor& x) {
  layer->eval();
  torch::NoGradGuard no_grad;
  const auto [y, n] = layer->forward_with_neighbours(x);
  EXPECT_TRUE(torch::equal(y, layer(x))) << "forward_with_neighbours gives forward's output";
  const auto& o = layer->options;
  EXPECT_EQ(n.indices.sizes(), (std::vector<int64_t>{x.size(0), o.heads(), y[0][0].numel(), o.k()}));
  EXPECT_EQ(n.weights.sizes(), n.indices.sizes());
  EXPECT_EQ(n.scores.sizes(), n.indices.sizes());
  EXPECT_TRUE(AllClose(aggregate_from(x, o.padding(), n, layer->kernel), y.flatten(2), 1e-12));
}

TEST(Neighbours, RecordedIndicesAndWeightsAreWhatTheSpatialLayerAggregated) {
  torch::manual_seed(31);
  const auto x = torch::randn({2, 4, 7, 6}, torch::kDouble);
  struct Case {
    const char* name;
    ConvNN2dOptions options;
  };
  const std::vector<Case> cases = {
      {"cosine, standard, fused", ConvNN2dOptions(4, 6, 5).padding(1)},
      {"cosine, standard, composed", ConvNN2dOptions(4, 6, 5).padding(1).fused(false)},
      {"two heads, depthwise, l1, softmax, stride (2,1), dilation (1,2)",
       ConvNN2dOptions(4, 4, 4).heads(2).aggregation(Aggregation::Depthwise).similarity(Similarity::L1)
           .rho(Rho::Softmax).padding(2).stride({2, 1}).dilation({1, 2})},
      {"random candidates", ConvNN2dOptions(4, 6, 5).padding(1).num_candidates(12).seed(4)},
      {"random candidates with the query itself, index order",
       ConvNN2dOptions(4, 6, 5).padding(1).num_candidates(12).include_self(true).slot_order(SlotOrder::Index)},
      {"gaussian, mean rho", ConvNN2dOptions(4, 6, 3).padding(1).similarity(Similarity::Gaussian).rho(Rho::Mean)},
      {"random candidates, stride 2, dilation 2", ConvNN2dOptions(4, 6, 4).padding(2).stride(2).dilation(2)
                                                      .num_candidates(6).seed(5)},
      {"random candidates with the query itself, stride (1,2), dilation (2,1)",
       ConvNN2dOptions(4, 6, 4).padding(2).stride({1, 2}).dilation({2, 1}).num_candidates(6).include_self(true)},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ConvNN2d layer(c.options);
    layer->to(torch::kDouble);
    expect_recorded_neighbours_reproduce_the_output(layer, x);
  }
}

// Coordinates only, chebyshev, K = R^D, index order: ConvNN is the convolution, so each query's
// neighbours are its R x R window on the dilated grid, in the window's row-major order, and the
// query positions are the stride lattice.
void expect_the_convolution_window(const Neighbours& n, const std::vector<int64_t>& stride,
                                   const std::vector<int64_t>& dilation) {
  const auto dims = static_cast<int64_t>(stride.size());
  const int64_t queries = n.query_positions.size(0);
  ASSERT_EQ(n.positions.size(2), queries);
  for (int64_t q = 0; q < queries; ++q) {
    std::vector<double> point;
    for (int64_t axis = 0; axis < dims; ++axis) {
      point.push_back((n.query_positions[q][axis].item<double>() + 0.5) / static_cast<double>(n.input_sizes[axis]));
    }
    const auto view = neighbour_view(n, point, /*sample=*/1);
    for (int64_t axis = 0; axis < dims; ++axis) EXPECT_EQ(view.query[axis], n.query_positions[q][axis].item<int64_t>());
    ASSERT_TRUE(torch::equal(n.positions[1][0][q], view.window)) << "query " << q << ": " << n.positions[1][0][q]
                                                                   << " against the window " << view.window;
  }
  // The window's rule, written out once more for the first query.
  std::vector<int64_t> first(dims);
  for (int64_t axis = 0; axis < dims; ++axis) first[axis] = n.query_positions[0][axis].item<int64_t>();
  EXPECT_EQ(n.positions[0][0][0][0][dims - 1].item<int64_t>(), first[dims - 1] - dilation[dims - 1])
      << "the window's first cell is one dilated step before the query on the last axis";
  EXPECT_TRUE(torch::equal(n.weights, torch::ones_like(n.weights))) << "uniform rho: each tap weighs 1";
}

template <size_t D>
ConvNNOptions<D> convolution_case(int64_t k, int64_t padding) {
  return ConvNNOptions<D>(2, 3, k).similarity(Similarity::Chebyshev).coordinates(true).alpha(0.0)
      .slot_order(SlotOrder::Index).padding(padding);
}

TEST(Neighbours, TheConvolutionCaseSelectsTheConvolutionWindowWithStrideAndDilation) {
  torch::manual_seed(32);
  const auto image = torch::randn({2, 2, 9, 8});
  for (const auto& [stride, dilation] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{1, 1}, {1, 1}}, {{2, 2}, {1, 1}}, {{1, 1}, {2, 2}}, {{2, 1}, {1, 3}}}) {
    SCOPED_TRACE("stride " + c10::str(stride) + ", dilation " + c10::str(dilation));
    ConvNN2d layer(convolution_case<2>(9, 3).stride(c10::IntArrayRef(stride)).dilation(c10::IntArrayRef(dilation)));
    torch::NoGradGuard no_grad;
    const auto n = std::get<1>(layer->forward_with_neighbours(image));
    EXPECT_EQ(n.query_grid, (std::vector<int64_t>{(9 + stride[0] - 1) / stride[0], (8 + stride[1] - 1) / stride[1]}));
    expect_the_convolution_window(n, stride, dilation);
  }
  {
    SCOPED_TRACE("1-D, stride 2, dilation 3");
    ConvNN1d layer(convolution_case<1>(3, 3).stride(2).dilation(3));
    torch::NoGradGuard no_grad;
    expect_the_convolution_window(std::get<1>(layer->forward_with_neighbours(torch::randn({2, 2, 11}))), {2}, {3});
  }
  {
    SCOPED_TRACE("3-D, dilation (1, 2, 1)");
    ConvNN3d layer(convolution_case<3>(27, 2).dilation({1, 2, 1}));
    torch::NoGradGuard no_grad;
    expect_the_convolution_window(std::get<1>(layer->forward_with_neighbours(torch::randn({2, 2, 4, 5, 3}))),
                                  {1, 1, 1}, {1, 2, 1});
  }
}

TEST(Neighbours, PositionsAreTheIndicesInThePaddedGridLessThePadding) {
  torch::manual_seed(33);
  ConvNN2d layer(ConvNN2dOptions(3, 3, 6).padding(2));
  torch::NoGradGuard no_grad;
  const auto n = std::get<1>(layer->forward_with_neighbours(torch::randn({1, 3, 5, 4})));
  const int64_t padded_width = 4 + 2 * 2;
  EXPECT_TRUE(torch::equal(n.positions.select(-1, 0), n.indices.div(padded_width, "floor") - 2));
  EXPECT_TRUE(torch::equal(n.positions.select(-1, 1), n.indices.remainder(padded_width) - 2));
  EXPECT_EQ(n.input_sizes, (std::vector<int64_t>{5, 4}));
  EXPECT_EQ(n.padding, 2);
  EXPECT_GE(n.positions.min().item<int64_t>(), -2);
  EXPECT_LE(n.positions.select(-1, 0).max().item<int64_t>(), 5 + 1);
}

TEST(Neighbours, AnUnbatchedInputGivesNeighboursWithoutTheBatchDimension) {
  torch::manual_seed(34);
  ConvNN2d layer(ConvNN2dOptions(3, 4, 9).padding(1));
  BranchingConv2d branching(BranchingConv2dOptions(3, 4, 9));
  ConvNNAttention attention(ConvNNAttentionOptions(8, 2, 3));
  torch::NoGradGuard no_grad;
  const auto image = torch::randn({3, 5, 6}), tokens = torch::randn({6, 8});
  const auto one = std::get<1>(layer->forward_with_neighbours(image));
  const auto batch = std::get<1>(layer->forward_with_neighbours(image.unsqueeze(0)));
  EXPECT_TRUE(torch::equal(one.indices, batch.indices[0]));
  EXPECT_TRUE(torch::equal(one.positions, batch.positions[0]));
  EXPECT_EQ(std::get<1>(branching->forward_with_neighbours(image)).indices.sizes(), (std::vector<int64_t>{1, 30, 9}));
  EXPECT_EQ(std::get<1>(attention->forward_with_neighbours(tokens)).indices.sizes(), (std::vector<int64_t>{2, 6, 3}));
}

TEST(Neighbours, AttentionNeighboursAreWhatItAggregatedPerHead) {
  torch::manual_seed(35);
  ConvNNAttention attention(ConvNNAttentionOptions(8, 2, 3));
  attention->to(torch::kDouble);
  attention->eval();
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, 7, 8}, torch::kDouble);
  const auto [y, n] = attention->forward_with_neighbours(x);
  EXPECT_TRUE(torch::equal(y, attention(x)));
  ASSERT_EQ(n.indices.sizes(), (std::vector<int64_t>{2, 2, 7, 3}));
  EXPECT_FALSE(n.positions.defined()) << "tokens have no grid until on_token_grid places them";
  // values [B,N,H,d] gathered per head, weighed, through the depthwise kernel [d,K], then projected.
  const auto values = attention->value_projection(x).view({2, 7, 2, 4}).permute({0, 2, 1, 3});  // [B,H,N,d]
  const auto gathered = values.unsqueeze(2).expand({-1, -1, 7, -1, -1}).gather(
      3, n.indices.unsqueeze(-1).expand({-1, -1, -1, -1, 4}));                               // [B,H,N,K,d]
  const auto aggregated = torch::einsum("bhnkc,bhnk,ck->bnhc", {gathered, n.weights, attention->kernel});
  EXPECT_TRUE(AllClose(attention->output_projection(aggregated.reshape({2, 7, 8})), y, 1e-12));
  EXPECT_TRUE(AllClose(n.weights.sum(-1), torch::ones({2, 2, 7}, torch::kDouble), 1e-12)) << "softmax rho";
}

TEST(Neighbours, TokensOnAGridPutThePrefixTokensOffItAndKeepThePatchQueries) {
  Neighbours attention;
  // An unbatched input ([H, N, K]): one head, 1 class token + a 2 x 3 grid of patches, K = 2.
  attention.indices = torch::tensor({0, 1, 6, 2, 3, 0, 4, 5, 1, 6, 2, 2, 3, 4}, torch::kLong).view({1, 7, 2});
  attention.weights = torch::rand({1, 7, 2});
  attention.scores = torch::rand({1, 7, 2});
  attention.k = 2;
  const auto n = on_token_grid(attention, {2, 3}, 1);
  EXPECT_EQ(n.indices.sizes(), (std::vector<int64_t>{1, 6, 2})) << "the class token's row is dropped";
  EXPECT_TRUE(torch::equal(n.indices, attention.indices.slice(1, 1)));
  EXPECT_TRUE(torch::equal(n.positions[0][1], torch::tensor({{0, 2}, {-1, -1}}, torch::kLong)))
      << "token 3 is patch (0, 2); token 0, the class token, is off the grid";
  EXPECT_TRUE(torch::equal(n.query_positions[4], torch::tensor({1, 1}, torch::kLong)));
  const auto view = neighbour_view(n, std::vector<double>{0.9, 0.1});
  EXPECT_EQ(view.query, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(view.row, 3) << "row-major on the 2 x 3 grid";
  EXPECT_TRUE(torch::equal(view.neighbours, n.positions.select(1, 3))) << "[H, K, D] of the query (1, 0), row 3";
  EXPECT_EQ(view.window.size(0), 0) << "attention has no convolution window";
  EXPECT_NE(error_of([&] { on_token_grid(attention, {2, 2}, 1); })
                .find("on_token_grid: the layer has 7 tokens, but prefix_tokens + the grid's [2, 2] = 5"),
            std::string::npos);
  EXPECT_NE(error_of([&] { neighbour_view(attention, std::vector<double>{0.5, 0.5}); })
                .find("neighbour_view: these neighbours are not on a grid"),
            std::string::npos);
  EXPECT_NE(error_of([&] { neighbour_view(n, std::vector<double>{0.5}); })
                .find("neighbour_view: point must have 2 coordinates"),
            std::string::npos);
  EXPECT_NE(error_of([&] { neighbour_view(n, std::vector<double>{0.5, 1.5}); })
                .find("neighbour_view: point must be fractions of the input in [0, 1], got [0.5, 1.5]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { neighbour_view(n, std::vector<double>{0.5, 0.5}, 1); })
                .find("neighbour_view: sample must be in [0, 1), got 1"),
            std::string::npos);
}

TEST(Neighbours, TheWindowSideIsTheLeastOddSideWithAtLeastKTaps) {
  EXPECT_EQ(window_side(1, 2), 1);
  EXPECT_EQ(window_side(9, 2), 3);
  EXPECT_EQ(window_side(10, 2), 5);
  EXPECT_EQ(window_side(27, 3), 3);
  EXPECT_EQ(window_side(28, 3), 5);
  EXPECT_EQ(window_side(3, 1), 3);
  EXPECT_NE(error_of([] { window_side(0, 2); }).find("window_side: k must be at least 1, got 0"), std::string::npos);
}

TEST(Neighbours, RecordingAModelKeepsEachLayerThatRanByItsPathAndStopsAfterwards) {
  torch::manual_seed(36);
  torch::nn::Sequential model(ConvNN2d(ConvNN2dOptions(3, 4, 9).padding(1)), torch::nn::ReLU(),
                              BranchingConv2d(BranchingConv2dOptions(4, 4, 9)),
                              BranchingConv2d(BranchingConv2dOptions(4, 4, 9).lambda(0.0)));
  model->eval();
  const auto x = torch::randn({2, 3, 6, 5});
  torch::NoGradGuard no_grad;
  const auto plain = model->forward(x);
  torch::Tensor recorded_output;
  const auto recorded = record_neighbours(*model, [&] { recorded_output = model->forward(x); });
  EXPECT_TRUE(torch::equal(recorded_output, plain)) << "recording does not change the output";
  ASSERT_EQ(recorded.size(), 2u) << "the lambda = 0 layer has no ConvNN branch; the branch module itself never runs";
  EXPECT_EQ(recorded[0].first, "0");
  EXPECT_EQ(recorded[1].first, "2");
  const auto direct = std::get<1>(model[2]->as<BranchingConv2dImpl>()->forward_with_neighbours(model[1]->as<torch::nn::ReLUImpl>()->forward(model[0]->as<ConvNN2dImpl>()->forward(x))));
  EXPECT_TRUE(torch::equal(recorded[1].second.indices, direct.indices));
  for (const auto& module : model->modules()) {
    if (auto* layer = dynamic_cast<NeighbourRecording*>(module.get())) EXPECT_FALSE(layer->records_neighbours());
  }
  // And after a forward that throws.
  EXPECT_THROW(record_neighbours(*model, [&] { model->forward(torch::randn({2, 5, 6, 5})); }), c10::Error);
  for (const auto& module : model->modules()) {
    if (auto* layer = dynamic_cast<NeighbourRecording*>(module.get())) {
      EXPECT_FALSE(layer->records_neighbours());
      EXPECT_FALSE(layer->last_neighbours().indices.defined());
    }
  }
}

}  // namespace

}  // namespace neighbours_test
