// ConvNNAttention's masks for batches of sequences (docs/sequences.md), against explicit
// references: each sequence run alone, and at k = N PyTorch's own masked dense attention. float64,
// so the tolerances are float64 rounding.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "convnn/nn/modules/convnn.h"
#include "support/assert_close.h"
#include "support/error_message.h"

namespace {

using convnn::nn::ConvNNAttention;
using convnn::nn::ConvNNAttentionOptions;
using convnn::testing::AllClose;
using convnn::testing::error_of;

constexpr int64_t kEmbed = 8, kHeads = 2;

ConvNNAttention layer(int64_t k) {
  at::manual_seed(0);
  ConvNNAttention attention(ConvNNAttentionOptions(kEmbed, kHeads, k));
  attention->to(at::kDouble);
  attention->eval();
  return attention;
}

// [B,N] bool, true at the padding positions (nn.MultiheadAttention's convention).
at::Tensor padding_of(const std::vector<int64_t>& lengths, int64_t n) {
  const auto position = at::arange(n).unsqueeze(0);
  return position >= at::tensor(lengths).unsqueeze(1);
}

// ConvNNAttention at k = N (scaled_dot, softmax, kernel of ones, no bias) is SDPA on its projections.
at::Tensor dense_attention(ConvNNAttention& attention, const at::Tensor& x, const at::Tensor& sdpa_mask) {
  const auto b = x.size(0), n = x.size(1);
  const auto heads = [&](torch::nn::Linear projection) {
    return projection(x).view({b, n, kHeads, -1}).transpose(1, 2);
  };
  const auto out = at::scaled_dot_product_attention(heads(attention->query_projection),
                                                    heads(attention->key_projection),
                                                    heads(attention->value_projection), sdpa_mask);
  return attention->output_projection(out.transpose(1, 2).reshape({b, n, kEmbed}));
}

TEST(AttentionMasks, KeyPaddingEqualsRunningEachSequenceAlone) {
  at::manual_seed(1);
  const std::vector<int64_t> lengths{7, 4, 5};
  auto attention = layer(3);
  const auto x = at::randn({3, 7, kEmbed}, at::kDouble);
  const auto batched = attention(x, at::Tensor(), padding_of(lengths, 7));
  for (int64_t b = 0; b < 3; ++b) {
    const auto alone = attention(x.slice(0, b, b + 1).slice(1, 0, lengths[b]));
    EXPECT_TRUE(AllClose(batched.slice(0, b, b + 1).slice(1, 0, lengths[b]), alone, 1e-12)) << "sample " << b;
  }
}

TEST(AttentionMasks, AtKEqualsNKeyPaddingAndPerHeadMasksAreMaskedScaledDotProductAttention) {
  at::manual_seed(2);
  const int64_t b = 2, n = 6;
  auto attention = layer(n);
  const auto x = at::randn({b, n, kEmbed}, at::kDouble);
  const auto padding = padding_of({6, 3}, n);
  auto allowed = at::rand({b, kHeads, n, n}) < 0.6;
  allowed = allowed.logical_or(at::eye(n, at::kBool));  // every query keeps a key (SDPA: NaN otherwise)
  const auto combined = allowed.logical_and(padding.logical_not().view({b, 1, 1, n}));
  // A row whose allowed keys are all padding has no selectable key: ConvNN outputs the bias (the
  // op's empty-row rule), SDPA NaN; such rows are left out of the comparison.
  const auto got = attention(x, allowed, padding);
  const auto expected = dense_attention(attention, x, combined);
  const auto comparable = combined.any(-1).all(1);  // [B,N]: rows with a key in every head
  const auto rows = comparable.unsqueeze(-1);
  EXPECT_TRUE(AllClose(got.masked_select(rows), expected.masked_select(rows), 1e-12));
  // The additive form of the same masks selects and weighs the same.
  const auto minus_inf = -std::numeric_limits<double>::infinity();
  const auto additive = [&](const at::Tensor& bools) {
    return at::zeros(bools.sizes(), at::kDouble).masked_fill(bools.logical_not(), minus_inf);
  };
  EXPECT_TRUE(AllClose(attention(x, additive(allowed), additive(padding.logical_not())), got, 1e-12));
}

TEST(AttentionMasks, ASequentialFillsTheMasksInAsAbsent) {
  auto attention = layer(3);
  torch::nn::Sequential sequential(attention);
  const auto x = at::randn({2, 5, kEmbed}, at::kDouble);
  EXPECT_TRUE(at::equal(sequential->forward(x), attention(x)));
}

TEST(AttentionMasks, AMaskOfTheWrongShapeOrDtypeIsRefusedByName) {
  auto attention = layer(2);
  const auto x = at::randn({2, 5, kEmbed}, at::kDouble);
  const auto expect_error = [&](const at::Tensor& attn_mask, const at::Tensor& padding, const std::string& rule) {
    const auto message = error_of([&] { attention(x, attn_mask, padding); });
    EXPECT_NE(message.find(rule), std::string::npos) << message;
  };
  expect_error(at::Tensor(), at::zeros({2, 6}, at::kBool), "key_padding_mask must be [B,N] = [2, 5]");
  expect_error(at::Tensor(), at::zeros({2, 5}, at::kLong), "key_padding_mask must be bool or floating point");
  expect_error(at::zeros({2, 3, 5, 5}, at::kBool), at::Tensor(),
               "attn_mask must be [N,N], [B,N,N] or [B,H,N,N] with N = 5, B = 2 (or 1) and H = num_heads = 2");
  expect_error(at::zeros({5, 4}, at::kBool), at::Tensor(), "attn_mask must be [N,N], [B,N,N] or [B,H,N,N]");
  expect_error(at::zeros({5, 5}, at::kInt), at::Tensor(), "attn_mask must be bool or floating point");
}

TEST(AttentionMasks, ASequenceShorterThanKIsTheLayerOfKEqualToItsLength) {
  // N = 3 keys < K = 5 (nn.MultiheadAttention takes any length): each row takes its valid keys and
  // masked slots of weight exactly 0 (the op's short-row rule), so the layer equals one of K = N
  // whose kernel is its own first N taps (slots in score order).
  for (const bool causal : {false, true}) {
    at::manual_seed(2);
    ConvNNAttention longer(ConvNNAttentionOptions(kEmbed, kHeads, 5).causal(causal));
    ConvNNAttention exact(ConvNNAttentionOptions(kEmbed, kHeads, 3).causal(causal));
    longer->to(at::kDouble);
    exact->to(at::kDouble);
    {
      at::NoGradGuard no_grad;
      const auto source = longer->named_parameters();
      for (auto& p : exact->named_parameters()) {
        const auto& from = source[p.key()];
        p.value().copy_(p.key() == "kernel" ? from.narrow(-1, 0, 3) : from);
      }
    }
    const auto x = at::randn({2, 3, kEmbed}, at::kDouble);
    EXPECT_TRUE(AllClose(longer(x), exact(x), 1e-12)) << "causal " << causal;
    EXPECT_TRUE(AllClose(longer(x[0]), exact(x[0]), 1e-12)) << "one sample, causal " << causal;
  }
}

}  // namespace
