// The cost counter against docs/flops.md. The whole-model numbers were computed by a separate
// implementation of the rules; the convolution, linear and attention MACs of ResNet-50 and
// ViT-B/16 also agree with torch.utils.flop_counter on the same architectures (which counts
// 2 x MACs).
#include "convnn/models/cost.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "convnn/models/registry.h"
#include "convnn/nn/modules/convnn.h"
#include "convnn/ops/cost.h"

namespace {

using namespace convnn::models;
namespace cnn = convnn::nn;

Cost total_of(const std::string& name, const ModelConfig& config) {
  return build_model(name, config).cost().total();
}

ModelConfig resnet(ResNetLayer layer, int64_t k = 9, int64_t r = 0) {
  ModelConfig config;
  config.resnet.layer = layer;
  config.convnn.k = k;
  config.convnn.num_candidates = r;
  return config;
}

ModelConfig vit(ViTAttention attention, int64_t k = 9, bool paper = false) {
  ModelConfig config;
  config.vit.attention = attention;
  config.convnn.k = k;
  config.vit.paper = paper;
  return config;
}

Cost sum_op(const CostReport& report, const std::string& op) {
  Cost sum;
  for (const auto& e : report.entries()) {
    if (e.op == op) sum += e.cost;
  }
  return sum;
}

TEST(Cost, FlopsAreTwiceTheMACsPlusOtherFlopsAndNeverComparisons) {
  const Cost cost{10, 3, 100};
  EXPECT_EQ(cost.flops(), 23);
  const auto total = Cost{1, 2, 3} + Cost{10, 20, 30};
  EXPECT_EQ(total.macs, 11);
  EXPECT_EQ(total.other_flops, 22);
  EXPECT_EQ(total.comparisons, 33);
}

TEST(Cost, ConvNNOperatorRules) {
  // N = 4 queries, M = 6 candidates, 2 heads, 8 features and channels, K = 3.
  CostReport report;
  add_convnn_op(
      report, "s", "l", {4, 6, 2, 8, 8, 8},
      {convnn::Similarity::ScaledDot, 3, cnn::Rho::Softmax, 1.0, cnn::Aggregation::Depthwise, false});
  ASSERT_EQ(report.entries().size(), 4u);
  const auto& e = report.entries();
  EXPECT_EQ(e[0].op, "similarity");
  EXPECT_EQ(e[0].cost.macs, 4 * 6 * 8);         // N*M*D
  EXPECT_EQ(e[0].cost.other_flops, 2 * 4 * 6);  // the scale, per head and score
  EXPECT_EQ(e[1].op, "topk");
  EXPECT_EQ(e[1].cost.flops(), 0);
  EXPECT_EQ(e[1].cost.comparisons, 2 * 4 * 6 * 2);  // H*N*M*ceil(log2 3)
  EXPECT_EQ(e[2].op, "rho");
  EXPECT_EQ(e[2].cost.other_flops, 4 * 2 * 4 * 3);  // softmax over H*N*K
  EXPECT_EQ(e[2].cost.comparisons, 2 * 4 * 3);
  EXPECT_EQ(e[3].op, "aggregation");
  EXPECT_EQ(e[3].cost.macs, 4 * 3 * 8);         // depthwise N*K*C
  EXPECT_EQ(e[3].cost.other_flops, 4 * 3 * 8);  // weighting

  CostReport standard;
  add_convnn_op(standard, "s", "l", {4, 6, 2, 8, 8, 6},
                {convnn::Similarity::Cosine, 4, cnn::Rho::Uniform, 1.0, cnn::Aggregation::Standard, true});
  ASSERT_EQ(standard.entries().size(), 3u);                              // uniform rho: no weights to compute
  EXPECT_EQ(standard.entries()[0].cost.macs, 4 * 6 * 8 + (4 + 6) * 8);   // scores + squared norms
  // Two products per head and score, a square root and a division per vector and head.
  EXPECT_EQ(standard.entries()[0].cost.other_flops, 2 * 2 * 4 * 6 + 2 * (4 + 6) * 2);
  EXPECT_EQ(standard.entries()[2].cost.macs, 4 * 4 * 8 * 6 / 2);         // N*K*C*C'/H
  EXPECT_EQ(standard.entries()[2].cost.other_flops, 4 * 6);              // bias only
}

TEST(Cost, RhoCostIsThePolicyRuleThatTheOperatorCostUses) {
  using convnn::ops::rho_cost;
  // Softmax: subtract, exp, sum, divide per slot (+ the temperature's division), a max comparison.
  const auto softmax = rho_cost(convnn::Rho::Softmax, 5, 7, 1.0);
  ASSERT_TRUE(softmax.has_value());
  EXPECT_EQ(softmax->other_flops, 4 * 5 * 7);
  EXPECT_EQ(softmax->comparisons, 5 * 7);
  EXPECT_EQ(rho_cost(convnn::Rho::Softmax, 5, 7, 0.5)->other_flops, 5 * 5 * 7);
  EXPECT_EQ(rho_cost(convnn::Rho::Mean, 5, 7, 1.0)->other_flops, 5);  // one reciprocal per row
  EXPECT_FALSE(rho_cost(convnn::Rho::Uniform, 5, 7, 1.0).has_value());
  // The operator's rho share is the same rule over H*N rows of K.
  const auto call = convnn::ops::knn_call_cost({4, 6, 2, 8, 8, 8},
                                               {convnn::Similarity::Dot, 3, convnn::Rho::Softmax, 2.0, true, false});
  ASSERT_TRUE(call.rho.has_value());
  EXPECT_EQ(call.rho->other_flops, rho_cost(convnn::Rho::Softmax, 2 * 4, 3, 2.0)->other_flops);
}

TEST(Cost, ResNet50MatchesTheConvolutionCount) {
  const auto cost = total_of("resnet50", resnet(ResNetLayer::Conv));
  EXPECT_EQ(cost.macs, 4'089'184'256);  // the "4.1 G" of the paper's Table 2 (MACs)
  EXPECT_EQ(cost.other_flops, 27'848'680);
  EXPECT_EQ(cost.comparisons, 11'214'336);
  EXPECT_EQ(cost.flops(), 8'206'217'192);
}

TEST(Cost, ResNet50WithConvNNAndBranchingLayers) {
  const auto convnn = total_of("resnet50", resnet(ResNetLayer::ConvNN, 9));
  EXPECT_EQ(convnn.macs, 6'456'535'296);
  EXPECT_EQ(convnn.other_flops, 95'951'084);
  EXPECT_EQ(convnn.comparisons, 147'310'856);
  EXPECT_EQ(total_of("resnet50", resnet(ResNetLayer::Branching, 9)).macs, 6'623'521'024);
  EXPECT_EQ(total_of("resnet50", resnet(ResNetLayer::Branching, 16)).macs, 7'207'971'072);
  EXPECT_EQ(total_of("resnet50", resnet(ResNetLayer::Branching, 9, 32)).macs, 4'296'001'536);
  EXPECT_EQ(total_of("resnet50", resnet(ResNetLayer::Branching, 16, 32)).macs, 4'880'451'584);
  EXPECT_EQ(total_of("resnet50", resnet(ResNetLayer::ConvNN, 9, 32)).macs, 4'129'015'808);
}

TEST(Cost, ConvNNAggregationCostsWhatTheConvolutionItReplacesCosts) {
  const auto conv = build_model("resnet50", resnet(ResNetLayer::Conv)).cost();
  const auto convnn = build_model("resnet50", resnet(ResNetLayer::ConvNN)).cost();
  int64_t slot_macs = 0;
  for (const auto& e : conv.entries()) {
    if (e.op == "conv2d" && e.layer.find(".conv2") != std::string::npos && e.layer.rfind("layer1", 0) == 0) {
      slot_macs += e.cost.macs;  // layer1: all three 3x3 convolutions are stride-1 slots
    }
  }
  int64_t aggregation_macs = 0;
  for (const auto& e : convnn.entries()) {
    if (e.op == "aggregation" && e.stage == "layer1") aggregation_macs += e.cost.macs;
  }
  EXPECT_EQ(aggregation_macs, slot_macs);
  // Everything else the ConvNN model adds is the similarity (and its comparisons).
  EXPECT_EQ(convnn.total().macs - conv.total().macs, sum_op(convnn, "similarity").macs);
  EXPECT_EQ(sum_op(convnn, "topk").flops(), 0);
  EXPECT_GT(sum_op(convnn, "topk").comparisons, 0);
}

TEST(Cost, ViTBase) {
  const auto mhsa = total_of("vit_base", vit(ViTAttention::MHSA));
  EXPECT_EQ(mhsa.macs, 17'563'828'224);  // 2 x = 35.13 G: Table 3's 35.1
  EXPECT_EQ(mhsa.other_flops, 109'950'520);
  EXPECT_EQ(mhsa.comparisons, 5'588'496);
  const auto convnn = total_of("vit_base", vit(ViTAttention::ConvNN, 9, true));
  EXPECT_EQ(convnn.macs, 17'222'504'448);  // 2 x = 34.45 G: Table 3's 34.4
  EXPECT_EQ(convnn.other_flops, 98'743'864);
  EXPECT_EQ(convnn.comparisons, 22'609'296);
  EXPECT_EQ(total_of("vit_base", vit(ViTAttention::ConvNN, 25, true)).macs, 17'251'553'280);
  // KVT runs the same operator with a fixed kernel: the same work.
  EXPECT_EQ(total_of("vit_base", vit(ViTAttention::KVT, 9, true)).macs, convnn.macs);
}

TEST(Cost, StagesAndParameters) {
  const auto resnet50 = build_model("resnet50", resnet(ResNetLayer::Branching));
  const auto stages = resnet50.cost().stages();
  std::vector<std::string> names;
  for (const auto& s : stages) names.push_back(s.stage);
  EXPECT_EQ(names, (std::vector<std::string>{"stem", "layer1", "layer2", "layer3", "layer4", "head"}));
  EXPECT_EQ(stages.front().parameters, 64 * 3 * 49 + 2 * 64);
  EXPECT_EQ(stages.back().parameters, 2048 * 1000 + 1000);
  EXPECT_EQ(resnet50.cost().parameters(), 26'474'760);

  const auto vit_base = build_model("vit_base", vit(ViTAttention::ConvNN, 9, true)).cost();
  const auto vit_stages = vit_base.stages();
  ASSERT_EQ(vit_stages.size(), 14u);
  EXPECT_EQ(vit_stages[0].stage, "embed");
  EXPECT_EQ(vit_stages[1].stage, "blocks.0");
  EXPECT_EQ(vit_stages[13].stage, "head");
  EXPECT_EQ(vit_base.parameters(), 86'379'496 + 12 * 64 * 9);
}

TEST(Cost, ResNetCostFollowsTheImageSize) {
  const auto model = build_model("resnet50", resnet(ResNetLayer::Conv));
  const auto net = model.get<ResNetImpl>();
  // Convolution MACs scale with the pixels while the fc layer's do not.
  const int64_t fc = 2048 * 1000;
  const auto at_224 = net->cost(224, 224).total().macs - fc;
  const auto at_448 = net->cost(448, 448).total().macs - fc;
  EXPECT_EQ(at_448, 4 * at_224);
}

TEST(OpCost, L1CountsADifferenceAnAbsoluteValueAndASumPerFeaturePair) {
  // N = 10 queries, M = 12 candidates, H = 2 heads, D = 8 features, K = 3.
  const auto call = convnn::ops::knn_call_cost({10, 12, 2, 8, 8, 8},
                                               {convnn::Similarity::L1, 3, convnn::Rho::Softmax, 0.5, true, false});
  EXPECT_EQ(call.similarity.macs, 0);
  EXPECT_EQ(call.similarity.other_flops, 3 * 10 * 12 * 8 + 2 * 10 * 3);  // + exp of the K reported
  EXPECT_EQ(call.topk.comparisons, 2 * 10 * 12 * 2);                      // ceil(log2 3) = 2
  ASSERT_TRUE(call.rho.has_value());
  EXPECT_EQ(call.rho->other_flops, 5 * 2 * 10 * 3);  // softmax 4 + the temperature
  EXPECT_EQ(call.aggregation.macs, 10 * 3 * 8);      // depthwise
  EXPECT_EQ(call.aggregation.other_flops, 10 * 3 * 8);  // weighting
  const auto uniform = convnn::ops::knn_call_cost({10, 12, 2, 8, 8, 8},
                                                  {convnn::Similarity::Dot, 3, convnn::Rho::Uniform, 1.0, true, false});
  EXPECT_FALSE(uniform.rho.has_value());
  EXPECT_EQ(uniform.aggregation.other_flops, 0);  // every weight is 1: no weighting
  EXPECT_THROW(convnn::ops::knn_call_cost({10, 12, 2, 8, 8, 8}, {convnn::Similarity::Dot, 0}), c10::Error);
}

}  // namespace

// A strided ConvNN2d: its queries are the ceil(H / s) x ceil(W / s) output positions, so its
// aggregation costs what the strided convolution it replaces costs, and the walk leaves the map at
// that size; with dilation, a query's candidates are its phase of the dilated grid.
TEST(Cost, StridedAndDilatedConvNN2dCountTheirOutputPositionsAndPhases) {
  using convnn::models::CostReport;
  convnn::nn::ConvNN2d strided(convnn::nn::ConvNN2dOptions(8, 16, 9).padding(1).stride(2));
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(8, 16, 3).stride(2).padding(1).bias(false));
  CostReport convnn_report, conv_report;
  int64_t h = 15, w = 16, conv_h = 15, conv_w = 16;
  convnn::models::add_spatial_layer(convnn_report, "s", "l", *strided, h, w);
  convnn::models::add_spatial_layer(conv_report, "s", "l", *conv, conv_h, conv_w);
  EXPECT_EQ(h, 8);
  EXPECT_EQ(w, 8);
  EXPECT_EQ(h, conv_h);
  EXPECT_EQ(w, conv_w);
  EXPECT_EQ(sum_op(convnn_report, "aggregation").macs, sum_op(conv_report, "conv2d").macs);
  // Dilation 2 on the 17 x 18 padded map: phases of at most 9 x 9 candidates, against 17 x 18.
  // (dot: the similarity is N M D MACs, proportional to M.)
  const auto dot = convnn::nn::ConvNN2dOptions(8, 16, 9).padding(1).similarity(convnn::Similarity::Dot);
  convnn::nn::ConvNN2d dilated(convnn::nn::ConvNN2dOptions(dot).dilation(2));
  convnn::nn::ConvNN2d plain(dot);
  CostReport dilated_report, plain_report;
  int64_t dh = 15, dw = 16, ph = 15, pw = 16;
  convnn::models::add_spatial_layer(dilated_report, "s", "l", *dilated, dh, dw);
  convnn::models::add_spatial_layer(plain_report, "s", "l", *plain, ph, pw);
  EXPECT_EQ(sum_op(dilated_report, "similarity").macs * 17 * 18, sum_op(plain_report, "similarity").macs * 9 * 9);
}
