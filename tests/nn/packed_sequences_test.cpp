// ConvNNAttention on packed variable-length batches (forward_packed, docs/sequences.md), against
// the explicit reference: the same sequences padded into a [B,N,C] batch with a key padding mask
// (itself proven equal to running each sequence alone, attention_masks_test.cpp). float64, so the
// tolerances are float64 rounding.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
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

ConvNNAttention layer(ConvNNAttentionOptions options) {
  at::manual_seed(0);
  ConvNNAttention attention(options);
  attention->to(at::kDouble);
  attention->eval();
  return attention;
}

// Lengths of every kind: repeated (one batch for both), shorter than k = 3 (the short-row rule),
// empty, and the longest.
const std::vector<int64_t> kLengths{5, 2, 5, 7, 0, 3, 1};

at::Tensor offsets_of(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> offsets{0};
  for (const int64_t length : lengths) offsets.push_back(offsets.back() + length);
  return at::tensor(offsets);
}

// The packed tokens' rows of a padded [S, max, C] batch.
at::Tensor unpad(const at::Tensor& padded, const std::vector<int64_t>& lengths) {
  std::vector<at::Tensor> rows;
  for (size_t s = 0; s < lengths.size(); ++s) rows.push_back(padded[s].narrow(0, 0, lengths[s]));
  return at::cat(rows);
}

class PackedSequences : public ::testing::TestWithParam<std::tuple<bool, int64_t>> {};

TEST_P(PackedSequences, EqualThePaddedBatchWithItsKeyPaddingMaskForwardAndBackward) {
  const auto [causal, kv_heads] = GetParam();
  auto attention = layer(ConvNNAttentionOptions(kEmbed, kHeads, 3).causal(causal).num_kv_heads(kv_heads).bias(true));
  const int64_t longest = 7, count = static_cast<int64_t>(kLengths.size());
  at::manual_seed(1);
  const auto padded_input = at::randn({count, longest, kEmbed}, at::kDouble);
  const auto padding = at::arange(longest).unsqueeze(0) >= at::tensor(kLengths).unsqueeze(1);
  const auto packed_input = unpad(padded_input, kLengths);
  const auto upstream = at::randn_like(packed_input);

  const auto packed = attention->forward_packed(packed_input, offsets_of(kLengths));
  (packed * upstream).sum().backward();
  std::vector<at::Tensor> packed_grads;
  for (const auto& p : attention->parameters()) packed_grads.push_back(p.grad().clone());
  attention->zero_grad();

  const auto expected = unpad(attention(padded_input, at::Tensor(), padding), kLengths);
  (expected * upstream).sum().backward();
  EXPECT_TRUE(AllClose(packed, expected, 1e-12));
  const auto parameters = attention->parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    EXPECT_TRUE(AllClose(packed_grads[i], parameters[i].grad(), 1e-11)) << "parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(CausalAndGroupedHeads, PackedSequences,
                         ::testing::Combine(::testing::Bool(), ::testing::Values<int64_t>(0, 1)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "causal" : "bidirectional") + "_kv" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(PackedSequencesInput, Int32OffsetsGiveWhatInt64OnesGive) {
  auto attention = layer(ConvNNAttentionOptions(kEmbed, kHeads, 2));
  const auto x = at::randn({12, kEmbed}, at::kDouble);
  const auto offsets = at::tensor(std::vector<int64_t>{0, 4, 9, 12});
  EXPECT_TRUE(at::equal(attention->forward_packed(x, offsets), attention->forward_packed(x, offsets.to(at::kInt))));
}

TEST(PackedSequencesInput, BadOffsetsAndOptionsAreRefusedByName) {
  const auto x = at::randn({6, kEmbed}, at::kDouble);
  const auto expect_error = [&](ConvNNAttentionOptions options, const at::Tensor& input, const at::Tensor& offsets,
                                const std::string& rule) {
    auto attention = layer(options);
    const auto message = error_of([&] { attention->forward_packed(input, offsets); });
    EXPECT_NE(message.find(rule), std::string::npos) << message;
  };
  const ConvNNAttentionOptions plain(kEmbed, kHeads, 2);
  const auto offsets = [](std::vector<int64_t> v) { return at::tensor(v); };
  expect_error(plain, x, offsets({1, 6}), "cu_seqlens must start at 0 and end at the token count T = 6");
  expect_error(plain, x, offsets({0, 5}), "cu_seqlens must start at 0 and end at the token count T = 6");
  expect_error(plain, x, offsets({0, 4, 3, 6}), "cu_seqlens must be non-decreasing, got cu_seqlens[1] = 4 > cu_seqlens[2] = 3");
  expect_error(plain, x, at::tensor({0.0, 6.0}), "cu_seqlens must be a 1-D int64 or int32 tensor");
  expect_error(plain, x, offsets({0}), "cu_seqlens must be a 1-D int64 or int32 tensor [S+1]");
  expect_error(plain, x.unsqueeze(0), offsets({0, 6}), "input must be [T,C]");
  expect_error(ConvNNAttentionOptions(plain).num_candidates(2), x, offsets({0, 6}),
               "num_candidates = 2 draws candidates over one sequence length");
  expect_error(ConvNNAttentionOptions(plain).mask(at::ones({6, 6}, at::kBool)), x, offsets({0, 6}),
               "(packed sequences): takes no attn_mask, key_padding_mask or fixed mask");
}

}  // namespace
