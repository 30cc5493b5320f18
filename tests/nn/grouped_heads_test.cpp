// Grouped-query and multi-query ConvNNAttention (num_kv_heads < num_heads), against explicit
// references: the same layer with every key/value head repeated for each query head of its group
// (num_kv_heads = num_heads, projections copied), and at k = N PyTorch's own grouped-query
// scaled_dot_product_attention. float64, so the tolerances are float64 rounding.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "convnn/nn/functional/convnn.h"
#include "convnn/nn/modules/convnn.h"
#include "support/assert_close.h"
#include "support/error_message.h"

namespace grouped_heads_test {  // apart from the files of its unity batch (tests/CMakeLists.txt)

namespace {

using convnn::nn::ConvNNAttention;
using convnn::nn::ConvNNAttentionOptions;
using convnn::testing::AllClose;
using convnn::testing::error_of;

constexpr int64_t kEmbed = 16, kHeads = 4, kHeadDim = kEmbed / kHeads;

// [kv*d, C] -> [H*d, C]: each key/value head's rows once for every query head of its group.
at::Tensor repeat_heads(const at::Tensor& weight, int64_t kv_heads) {
  const auto group = kHeads / kv_heads;
  const auto rows = weight.view({kv_heads, 1, kHeadDim, -1}).expand({kv_heads, group, kHeadDim, weight.size(-1)});
  return rows.reshape({kHeads * kHeadDim, -1});
}

struct Twins {
  ConvNNAttention grouped{nullptr};
  ConvNNAttention repeated{nullptr};  // num_kv_heads = num_heads, the grouped layer's weights
};

Twins twins(ConvNNAttentionOptions options, int64_t kv_heads) {
  at::manual_seed(0);
  Twins t{ConvNNAttention(ConvNNAttentionOptions(options).num_kv_heads(kv_heads)),
          ConvNNAttention(ConvNNAttentionOptions(options).num_kv_heads(0))};
  for (auto* layer : {&t.grouped, &t.repeated}) {
    (*layer)->to(at::kDouble);
    (*layer)->eval();
  }
  at::NoGradGuard no_grad;
  for (const auto& item : t.grouped->named_parameters()) {
    const auto& name = item.key();
    auto p = item.value();
    auto target = t.repeated->named_parameters()[name];
    const bool kv = name.rfind("key_projection", 0) == 0 || name.rfind("value_projection", 0) == 0;
    // Random kernel and bias (the defaults are ones and zeros), so that every term is exercised.
    if (!kv && name.rfind("kernel", 0) == 0) p.uniform_(-1, 1);
    if (!kv && name == "bias") p.uniform_(-1, 1);
    target.copy_(kv ? repeat_heads(p.dim() == 1 ? p.unsqueeze(-1) : p, kv_heads).view_as(target) : p);
  }
  return t;
}

ConvNNAttentionOptions options(int64_t k) { return ConvNNAttentionOptions(kEmbed, kHeads, k); }

TEST(GroupedHeads, KeyAndValueProjectionsGiveKvHeadsTimesHeadDim) {
  const auto t = twins(options(3), 2);
  EXPECT_EQ(t.grouped->key_projection->weight.sizes(), (std::vector<int64_t>{2 * kHeadDim, kEmbed}));
  EXPECT_EQ(t.grouped->value_projection->weight.sizes(), (std::vector<int64_t>{2 * kHeadDim, kEmbed}));
  EXPECT_EQ(t.grouped->query_projection->weight.sizes(), (std::vector<int64_t>{kEmbed, kEmbed}));
}

// Every path the layer can take: fused and composed, per-head kernels, standard aggregation, slot
// orders, masks, random candidates (packed) and random candidates with the query itself (which
// repeats the key/value heads instead), for grouped (2) and multi-query (1) heads.
struct Case {
  std::string name;
  std::function<ConvNNAttentionOptions(ConvNNAttentionOptions)> configure;
};

class GroupedHeadsPaths : public ::testing::TestWithParam<std::tuple<Case, int64_t>> {};

TEST_P(GroupedHeadsPaths, EqualTheLayerWithEachKeyValueHeadRepeatedPerQueryHead) {
  const auto& [c, kv_heads] = GetParam();
  auto t = twins(c.configure(options(3)), kv_heads);
  at::manual_seed(1);
  const auto x = at::randn({3, 7, kEmbed}, at::kDouble);
  const auto padding = at::arange(7).unsqueeze(0) >= at::tensor(std::vector<int64_t>{7, 4, 6}).unsqueeze(1);
  const auto [got, got_neighbours] = t.grouped->forward_with_neighbours(x, at::Tensor(), padding);
  const auto [expected, expected_neighbours] = t.repeated->forward_with_neighbours(x, at::Tensor(), padding);
  EXPECT_TRUE(AllClose(got, expected, 1e-12));
  EXPECT_TRUE(at::equal(got_neighbours.indices, expected_neighbours.indices));
  EXPECT_TRUE(AllClose(got_neighbours.weights, expected_neighbours.weights, 1e-12));
}

TEST_P(GroupedHeadsPaths, GradientsAreTheRepeatedLayersSummedOverEachGroup) {
  const auto& [c, kv_heads] = GetParam();
  auto t = twins(c.configure(options(3)), kv_heads);
  at::manual_seed(2);
  const auto x = at::randn({2, 6, kEmbed}, at::kDouble);
  const auto upstream = at::randn({2, 6, kEmbed}, at::kDouble);
  (t.grouped(x) * upstream).sum().backward();
  (t.repeated(x) * upstream).sum().backward();
  for (const auto& item : t.grouped->named_parameters()) {
    const auto& name = item.key();
    const auto& p = item.value();
    const auto repeated = t.repeated->named_parameters()[name].grad();
    const bool kv = name.rfind("key_projection", 0) == 0 || name.rfind("value_projection", 0) == 0;
    // A shared key/value row's gradient is the sum of its copies' gradients.
    const auto expected =
        kv ? repeated.reshape({kv_heads, kHeads / kv_heads, kHeadDim, -1}).sum(1).view_as(p) : repeated;
    EXPECT_TRUE(AllClose(p.grad(), expected, 1e-11)) << name;
  }
}

std::vector<Case> cases() {
  using O = ConvNNAttentionOptions;
  return {
      {"fused", [](O o) { return o; }},
      {"composed", [](O o) { return o.fused(false); }},
      {"kernel_per_head", [](O o) { return o.kernel_per_head(true).bias(true); }},
      {"standard_index_order",
       [](O o) { return o.aggregation(convnn::nn::Aggregation::Standard).slot_order(convnn::nn::SlotOrder::Index); }},
      {"causal_cosine", [](O o) { return o.causal(true).similarity(convnn::Similarity::Cosine); }},
      {"random_candidates", [](O o) { return o.num_candidates(4).seed(5); }},
      {"random_candidates_with_self", [](O o) { return o.num_candidates(4).include_self(true).seed(5); }},
  };
}

INSTANTIATE_TEST_SUITE_P(Paths, GroupedHeadsPaths, ::testing::Combine(::testing::ValuesIn(cases()),
                                                                      ::testing::Values<int64_t>(2, 1)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_kv" + std::to_string(std::get<1>(info.param));
                         });

// At N = 80 with 4 query heads per key/value head, repeating the shared causal [N,N] mask for the
// group's rows would copy more than repeating the keys and values per head: the layer repeats
// those instead. Still the repeated layer's result, selection and gradients.
TEST(GroupedHeads, ALongSharedMaskRepeatsTheKeyValueHeadsInsteadWithTheSameResult) {
  auto t = twins(options(3).causal(true), 1);
  at::manual_seed(4);
  const auto x = at::randn({1, 80, kEmbed}, at::kDouble);
  const auto [got, got_neighbours] = t.grouped->forward_with_neighbours(x);
  const auto [expected, expected_neighbours] = t.repeated->forward_with_neighbours(x);
  EXPECT_TRUE(AllClose(got, expected, 1e-12));
  EXPECT_TRUE(at::equal(got_neighbours.indices, expected_neighbours.indices));
}

TEST(GroupedHeads, AtKEqualsNTheyAreGroupedQueryScaledDotProductAttention) {
  const int64_t b = 2, n = 6, kv_heads = 2;
  at::manual_seed(0);
  ConvNNAttention attention(options(n).num_kv_heads(kv_heads));
  attention->to(at::kDouble);
  const auto x = at::randn({b, n, kEmbed}, at::kDouble);
  const auto heads = [&](torch::nn::Linear projection, int64_t count) {
    return projection(x).view({b, n, count, kHeadDim}).transpose(1, 2);
  };
  const auto causal = at::ones({n, n}, at::kBool).tril();
  const auto dense = at::scaled_dot_product_attention(
      heads(attention->query_projection, kHeads), heads(attention->key_projection, kv_heads),
      heads(attention->value_projection, kv_heads), causal, 0.0, false, c10::nullopt, /*enable_gqa=*/true);
  const auto expected = attention->output_projection(dense.transpose(1, 2).reshape({b, n, kEmbed}));
  EXPECT_TRUE(AllClose(attention(x, causal), expected, 1e-12));
}

TEST(GroupedHeads, AKvHeadCountThatDoesNotDivideTheHeadsIsRefusedByName) {
  EXPECT_NE(error_of([] { ConvNNAttention(options(3).num_kv_heads(3)); })
                .find("ConvNNAttention: num_kv_heads = 3 must divide num_heads = 4"),
            std::string::npos);
  EXPECT_NE(error_of([] { ConvNNAttention(options(3).num_kv_heads(-1)); }).find("num_kv_heads = -1"),
            std::string::npos);
}

TEST(GroupedHeads, TheFunctionalFormChecksTheKeyValueChannelsAgainstKvHeads) {
  namespace F = convnn::nn::functional;
  const auto q = at::randn({1, 5, 8}, at::kDouble);
  const auto kernel = at::ones({2, 3}, at::kDouble);
  const auto o = F::ConvNNFuncOptions(3).heads(4).kv_heads(2);
  // Keys of 2 heads of d = 2: fine; of 2 heads of d = 3: the per-head widths differ.
  EXPECT_EQ(F::conv_nn(q, at::randn({1, 5, 4}, at::kDouble), at::randn({1, 5, 4}, at::kDouble), kernel, {}, o).sizes(),
            (std::vector<int64_t>{1, 5, 8}));
  EXPECT_NE(error_of([&] {
              F::conv_nn(q, at::randn({1, 5, 6}, at::kDouble), at::randn({1, 5, 4}, at::kDouble), kernel, {}, o);
            }).find("with heads = 4 and kv_heads = 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { F::conv_nn(q, q, q, kernel, {}, F::ConvNNFuncOptions(3).heads(4).kv_heads(3)); })
                .find("kv_heads = 3 must divide heads = 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              F::conv_nn2d(at::randn({1, 4, 3, 3}, at::kDouble), kernel, {}, F::ConvNNFuncOptions(3).heads(2).kv_heads(1));
            }).find("kv_heads = 1 applies to token inputs only"),
            std::string::npos);
}

}  // namespace

}  // namespace grouped_heads_test
