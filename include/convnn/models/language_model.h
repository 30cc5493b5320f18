#pragma once
// A decoder-only language model (GPT's layout: token and position embeddings, pre-norm causal
// transformer blocks, a final LayerNorm and a linear head over the vocabulary) whose attention is
// multi-head self-attention, KVT or ConvNN attention: the models lm_tiny and lm_small of the registry.
// It decodes incrementally with one key/value cache per block (generate).
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "convnn/models/cost.h"
#include "convnn/models/vit.h"
#include "convnn/nn/kv_cache.h"

namespace convnn::models {

struct LanguageModelOptions {
  LanguageModelOptions(int64_t embed_dim, int64_t depth, int64_t num_heads, int64_t context)
      : embed_dim_(embed_dim), depth_(depth), num_heads_(num_heads), context_(context) {}
  /// 128 wide, 4 deep, 4 heads, 256 tokens.
  static LanguageModelOptions tiny() { return {128, 4, 4, 256}; }
  /// 256 wide, 6 deep, 8 heads, 512 tokens.
  static LanguageModelOptions small() { return {256, 6, 8, 512}; }

  TORCH_ARG(int64_t, embed_dim);
  TORCH_ARG(int64_t, depth);
  TORCH_ARG(int64_t, num_heads);
  /// The longest sequence: the rows of the position table, the tokens a cache holds at most.
  TORCH_ARG(int64_t, context);
  TORCH_ARG(int64_t, vocab_size) = 256;  // bytes
  TORCH_ARG(int64_t, num_kv_heads) = 0;  // 0 = num_heads
  TORCH_ARG(int64_t, mlp_dim) = 0;       // 0 = 4 * embed_dim
  TORCH_ARG(ViTAttention, attention) = ViTAttention::MHSA;
  /// KVT and ConvNN attention: K, similarity, rho, candidates (the blocks set the sizes and causal).
  TORCH_ARG(nn::ConvNNAttentionOptions, convnn) = nn::ConvNNAttentionOptions(1, 1, 9);
  TORCH_ARG(PositionEmbedding, position_embedding) = PositionEmbedding::Learned;
  TORCH_ARG(bool, attention_bias) = true;
  TORCH_ARG(double, dropout) = 0.0;
  TORCH_ARG(double, attention_dropout) = 0.0;
  TORCH_ARG(double, drop_path) = 0.0;
};

class LanguageModelImpl : public torch::nn::Cloneable<LanguageModelImpl> {
 public:
  explicit LanguageModelImpl(LanguageModelOptions options);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// tokens int64 [B,T] (T <= context) -> logits [B,T,vocab_size], each position's prediction of
  /// the next token from the tokens up to it.
  at::Tensor forward(const at::Tensor& tokens);
  /// One empty key/value cache per block, for `batch` samples of up to `max_length` tokens
  /// (<= context).
  std::vector<nn::KVCache> make_caches(int64_t batch, int64_t max_length) const;
  /// The next tokens [B,t] of every sample after the tokens the caches hold (the same number for
  /// every sample) -> their logits [B,t,vocab_size], equal to those rows of forward on the whole
  /// prefix; the caches take the new tokens.
  at::Tensor forward_step(const at::Tensor& tokens, std::vector<nn::KVCache>& caches);
  /// Every operation for one sequence of `tokens` tokens, and the parameters per stage (embed,
  /// blocks.i, head). Scores are counted dense (N^2), as the unfused kernels compute them.
  CostReport cost(int64_t tokens) const;

  LanguageModelOptions options;
  torch::nn::Embedding token_embed{nullptr};
  /// [1, context, D]: a parameter when learned, a buffer when sinusoidal.
  at::Tensor pos_embed;
  torch::nn::Dropout pos_drop{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear head{nullptr};

 private:
  at::Tensor logits(const at::Tensor& tokens, int64_t first_position, std::vector<nn::KVCache>* caches);
};
TORCH_MODULE(LanguageModel);

/// The rule for a language model's tokens, of forward, forward_step and generate and of the Python
/// package's model (the op convnn::language_model_check_tokens): int64 [B, T] with T >= 1, ids in
/// [0, vocab_size), at positions first_position .. first_position + T - 1 within the context.
/// c10::Error naming `argument`.
void check_tokens(const at::Tensor& tokens, int64_t vocab_size, int64_t context, int64_t first_position,
                  const std::string& argument);

/// How generate samples each next token: from softmax(logits / temperature) restricted to the
/// top_k most likely tokens (0: all), or the most likely one when temperature is 0.
struct SamplingOptions {
  double temperature = 1.0;
  int64_t top_k = 0;
};

/// One token per row of logits [B, V] by `options`, drawn with `generator` (the default CPU one when
/// undefined): int64 [B] on the logits' device. The sampling rule of generate, of `convnn generate`
/// and of the Python package (the op convnn::sample_tokens). c10::Error naming a bad option.
at::Tensor sample_tokens(const at::Tensor& logits, const SamplingOptions& options,
                         std::optional<at::Generator> generator = std::nullopt);

/// The tokens generate reads again when the caches hold the whole context: the last context / 2
/// (at least 1), at positions from 0.
int64_t generation_restart_tokens(int64_t context);

/// The prompts [B,P] (int64, 1 <= P <= context) followed by max_new_tokens tokens sampled one at a
/// time with the model's caches (eval mode, no gradients; the model's mode is restored): [B, P +
/// max_new_tokens]. When the caches hold the context, they restart from the last context / 2
/// tokens (read again at positions from 0), so any length can be sampled. The draws come from a
/// CPU generator seeded with `seed`: a seed gives the same text on every run on one machine.
at::Tensor generate(LanguageModelImpl& model, const at::Tensor& prompts, int64_t max_new_tokens,
                    const SamplingOptions& options, uint64_t seed);

}  // namespace convnn::models
