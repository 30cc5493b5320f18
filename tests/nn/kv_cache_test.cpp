// Incremental decoding with a key/value cache (ConvNNAttention::forward_step, KVCache), against the
// explicit reference: the full causal forward on the whole prefix. float64; the step computes the
// same scores over the same keys, but the op sees other shapes (one query row against the cache,
// not N rows against N keys), so the tolerance is float64 rounding rather than bitwise.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "convnn/nn/kv_cache.h"
#include "convnn/nn/modules/convnn.h"
#include "support/assert_close.h"
#include "support/error_message.h"

namespace kv_cache_test {  // apart from the files of its unity batch (tests/CMakeLists.txt)

namespace {

using convnn::nn::ConvNNAttention;
using convnn::nn::ConvNNAttentionOptions;
using convnn::nn::KVCache;
using convnn::testing::AllClose;
using convnn::testing::error_of;

constexpr int64_t kEmbed = 8, kHeads = 2, kK = 3;

ConvNNAttention causal_layer(int64_t kv_heads) {
  at::manual_seed(0);
  ConvNNAttention attention(ConvNNAttentionOptions(kEmbed, kHeads, kK).causal(true).num_kv_heads(kv_heads).bias(true));
  attention->to(at::kDouble);
  attention->eval();
  at::NoGradGuard no_grad;
  attention->kernel.uniform_(-1, 1);
  attention->bias.uniform_(-1, 1);
  return attention;
}

class Decoding : public ::testing::TestWithParam<int64_t> {};

TEST_P(Decoding, TokenByTokenEqualsTheCausalForwardRowByRow) {
  auto attention = causal_layer(GetParam());
  at::manual_seed(1);
  const int64_t b = 2, n = 7;
  const auto x = at::randn({b, n, kEmbed}, at::kDouble);
  const auto full = attention(x);
  auto cache = attention->make_cache(b, n);
  const int64_t kv = GetParam() == 0 ? kHeads : GetParam();
  EXPECT_EQ(cache.keys().sizes(), (std::vector<int64_t>{b, kv, n, kEmbed / kHeads}));  // head-major
  for (int64_t i = 0; i < n; ++i) {  // the first rows hold fewer than k keys: the short-row rule
    const auto step = attention->forward_step(x.narrow(1, i, 1), cache);
    EXPECT_TRUE(AllClose(step, full.narrow(1, i, 1), 1e-12)) << "token " << i;
  }
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{n, n}));
}

TEST_P(Decoding, APromptThenTokensEqualsTheCausalForward) {
  auto attention = causal_layer(GetParam());
  at::manual_seed(2);
  const int64_t b = 2, n = 9, prompt = 5;
  const auto x = at::randn({b, n, kEmbed}, at::kDouble);
  const auto full = attention(x);
  auto cache = attention->make_cache(b, 16);
  EXPECT_TRUE(AllClose(attention->forward_step(x.narrow(1, 0, prompt), cache), full.narrow(1, 0, prompt), 1e-12));
  EXPECT_TRUE(AllClose(attention->forward_step(x.narrow(1, prompt, 2), cache), full.narrow(1, prompt, 2), 1e-12));
  for (int64_t i = prompt + 2; i < n; ++i) {
    EXPECT_TRUE(AllClose(attention->forward_step(x.narrow(1, i, 1), cache), full.narrow(1, i, 1), 1e-12));
  }
}

TEST_P(Decoding, SamplesOfDifferentLengthsEachEqualTheirOwnCausalForward) {
  auto attention = causal_layer(GetParam());
  at::manual_seed(3);
  const std::vector<int64_t> prompts{5, 2};
  const int64_t n = 8;
  const auto x = at::randn({2, n, kEmbed}, at::kDouble);
  auto cache = attention->make_cache(2, n);
  // The prompts as one padded step (sample 1 takes its first 2 rows), then one token per sample per
  // step: sample b's token t is x[b, prompts[b] + t].
  const auto prompt_out = attention->forward_step(x.narrow(1, 0, 5), cache, prompts);
  EXPECT_EQ(cache.lengths(), prompts);
  std::vector<std::vector<at::Tensor>> rows(2);
  for (int64_t s = 0; s < 2; ++s) rows[s].push_back(prompt_out[s].narrow(0, 0, prompts[s]));
  for (int64_t t = 0; t < 3; ++t) {
    const auto next = at::stack({x[0][prompts[0] + t], x[1][prompts[1] + t]}).unsqueeze(1);
    const auto out = attention->forward_step(next, cache);
    for (int64_t s = 0; s < 2; ++s) rows[s].push_back(out[s]);
  }
  for (int64_t s = 0; s < 2; ++s) {
    const int64_t length = prompts[s] + 3;
    const auto alone = attention(x[s].narrow(0, 0, length).unsqueeze(0))[0];
    EXPECT_TRUE(AllClose(at::cat(rows[s]), alone, 1e-12)) << "sample " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(KvHeads, Decoding, ::testing::Values<int64_t>(0, 1),
                         [](const auto& info) { return "kv" + std::to_string(info.param); });

TEST(KVCacheRules, AStepPastMaxLengthIsRefusedWithTheSampleNamed) {
  auto attention = causal_layer(0);
  auto cache = attention->make_cache(1, 4);
  const auto x = at::randn({1, 3, kEmbed}, at::kDouble);
  attention->forward_step(x, cache);
  const auto message = error_of([&] { attention->forward_step(x.narrow(1, 0, 2), cache); });
  EXPECT_NE(message.find("KVCache: sample 0 holds 3 tokens; 2 more would pass max_length = 4"), std::string::npos)
      << message;
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{3}));  // a refused step changes nothing
  cache.reset();
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{0}));
  EXPECT_NO_THROW(attention->forward_step(x, cache));
}

TEST(KVCacheRules, TruncateRollsBackAndTheSameTokenDecodesTheSameRowAgain) {
  auto attention = causal_layer(0);
  auto cache = attention->make_cache(2, 6);
  const auto x = at::randn({2, 5, kEmbed}, at::kDouble);
  attention->forward_step(x.narrow(1, 0, 4), cache, {4, 2});
  const auto first = attention->forward_step(x.narrow(1, 4, 1), cache);
  cache.truncate(3);  // sample 0 back to 3 tokens, sample 1 (3 tokens) unchanged
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{3, 3}));
  cache.truncate(5);
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{3, 3}));
  attention->forward_step(x.narrow(1, 3, 1), cache, {1, 0});  // sample 0's 4th token again
  cache.truncate(4);
  // To rounding, not bitwise: the second step projects one sample's token where the first projected
  // both samples', and a GEMM of one row may take another code path than one of two (MKL on Intel
  // Xeon rounded them apart in the last bits); a wrong rollback moves the row by far more.
  const auto again = attention->forward_step(x.narrow(1, 4, 1), cache, {1, 0})[0];
  EXPECT_TRUE(at::allclose(again, first[0], /*rtol=*/0, /*atol=*/1e-12))
      << "max difference " << (again - first[0]).abs().max().item<double>();
}

TEST(KVCacheRules, BadShapesAndCountsAreRefusedByName) {
  auto attention = causal_layer(0);
  auto cache = attention->make_cache(2, 8);
  const auto x = at::randn({2, 3, kEmbed}, at::kDouble);
  EXPECT_NE(error_of([&] { attention->forward_step(at::randn({3, 1, kEmbed}, at::kDouble), cache); })
                .find("input must be [B,t,C] with B = the cache's batch = 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { attention->forward_step(x, cache, {1}); }).find("KVCache: counts has 1 entries for a batch of 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { attention->forward_step(x, cache, {1, 4}); }).find("counts[1] = 4 must be in [0, t = 3]"),
            std::string::npos);
  EXPECT_NE(error_of([] { KVCache(0, 4, 1, 2, 2, at::kDouble); }).find("KVCache: batch, max_length"), std::string::npos);
}

TEST(KVCacheRules, ACacheShorterThanKDecodesAsTheCausalForward) {
  auto attention = causal_layer(0);
  auto cache = attention->make_cache(1, 2);  // k = 3: the short-row rule on every row
  const auto x = at::randn({1, 3, kEmbed}, at::kDouble);
  // The layer refuses N = 2 < k; causal rows 0 and 1 of a 3-token forward see the same keys.
  EXPECT_TRUE(AllClose(attention->forward_step(x.narrow(1, 0, 2), cache), attention(x).narrow(1, 0, 2), 1e-12));
}

}  // namespace

}  // namespace kv_cache_test
