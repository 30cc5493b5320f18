#pragma once
// Vision Transformer (the timm layout: pre-norm blocks, class token, fused qkv) whose attention is
// multi-head self-attention, KVT or ConvNN attention, plus the paper authors' variant.
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <string_view>
#include <tuple>
#include <vector>

#include "convnn/models/cost.h"
#include "convnn/nn/kv_cache.h"
#include "convnn/nn/options/convnn.h"

namespace convnn::models {

/// mhsa: softmax(QK^T/sqrt(d))V through scaled_dot_product_attention. kvt: ConvNN attention with a
/// fixed kernel of ones (softmax over the top-K scores). convnn: ConvNN attention with a learned
/// depthwise kernel initialised to ones.
enum class ViTAttention { MHSA, KVT, ConvNN };
/// learned: a trained [N+1, D] table. sinusoidal: fixed 1-D sin/cos over the token index.
enum class PositionEmbedding { Learned, Sinusoidal };
ViTAttention parse_vit_attention(std::string_view name);
PositionEmbedding parse_position_embedding(std::string_view name);
const char* to_string(ViTAttention attention);
const char* to_string(PositionEmbedding embedding);
/// The names in enum order (the one table the parse_* and to_string functions read).
const std::vector<std::string>& vit_attention_names();
const std::vector<std::string>& position_embedding_names();

struct SelfAttentionOptions {
  SelfAttentionOptions(int64_t embed_dim, int64_t num_heads) : embed_dim_(embed_dim), num_heads_(num_heads) {}
  TORCH_ARG(int64_t, embed_dim);
  TORCH_ARG(int64_t, num_heads);
  /// Bias of the fused qkv projection and of the output projection.
  TORCH_ARG(bool, bias) = true;
  /// Dropout on the attention weights (training only).
  TORCH_ARG(double, dropout) = 0.0;
  /// Key/value heads shared by groups of query heads (grouped-query attention); 0: num_heads. Must
  /// divide num_heads.
  TORCH_ARG(int64_t, num_kv_heads) = 0;
  /// Each token attends to itself and the tokens before it (a decoder).
  TORCH_ARG(bool, causal) = false;

 public:
  int64_t kv_heads() const { return num_kv_heads_ > 0 ? num_kv_heads_ : num_heads_; }
};

/// Multi-head self-attention on [B,N,C] as timm builds it: a fused qkv Linear(C, 3C), then
/// scaled_dot_product_attention, then proj Linear(C, C). With grouped key/value heads the fused
/// projection is Linear(C, C + 2 kv_heads d): the queries, then the keys, then the values.
class SelfAttentionImpl : public torch::nn::Cloneable<SelfAttentionImpl> {
 public:
  explicit SelfAttentionImpl(SelfAttentionOptions options);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(const at::Tensor& input);
  /// An empty key/value cache for decoding: `batch` samples of up to `max_length` tokens.
  nn::KVCache make_cache(int64_t batch, int64_t max_length) const;
  /// One decoding step of the causal attention (nn::ConvNNAttentionImpl::forward_step's contract):
  /// input [B,t,C], the next t tokens of each sample (sample b's first counts[b]; all when empty),
  /// attend to the cached tokens and to each other causally, and are appended to the cache.
  at::Tensor forward_step(const at::Tensor& input, nn::KVCache& cache, const std::vector<int64_t>& counts = {});

  SelfAttentionOptions options;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};

 private:
  /// q [B,H,N,d], k and v [B,kv,N,d] of input [B,N,C].
  std::tuple<at::Tensor, at::Tensor, at::Tensor> project(const at::Tensor& input);
};
TORCH_MODULE(SelfAttention);

/// Heads [B,h,t,d] as the channels of tokens [B,t,h*d]: what a KVCache appends.
at::Tensor flat_heads(const at::Tensor& heads);
/// The causal attention of a decoding step after its keys and values were appended to the cache:
/// queries [B,H,t,d] against cache_keys and cache_values [B,kv,L,d] (kv dividing H), new token i of
/// sample b seeing the cached positions up to lengths_before[b] + i. -> [B,H,t,d]. The one rule of
/// SelfAttention.forward_step in C++ and Python (the op convnn::self_attention_step).
at::Tensor attend_to_cache(const at::Tensor& queries, const at::Tensor& cache_keys, const at::Tensor& cache_values,
                           const std::vector<int64_t>& lengths_before);

/// Stochastic depth: in training, zeroes a sample's residual branch with probability p and scales
/// the kept ones by 1/(1-p); the identity in eval.
class DropPathImpl : public torch::nn::Cloneable<DropPathImpl> {
 public:
  explicit DropPathImpl(double probability = 0.0);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(const at::Tensor& input);

  double probability;
};
TORCH_MODULE(DropPath);

struct TransformerBlockOptions {
  TransformerBlockOptions(int64_t embed_dim, int64_t num_heads)
      : embed_dim_(embed_dim), num_heads_(num_heads) {}
  TORCH_ARG(int64_t, embed_dim);
  TORCH_ARG(int64_t, num_heads);
  TORCH_ARG(int64_t, mlp_dim) = 0;  // 0 = 4 * embed_dim
  TORCH_ARG(ViTAttention, attention) = ViTAttention::MHSA;
  /// KVT and ConvNN attention: K, similarity, rho, candidates, ...; embed_dim, num_heads, biases
  /// and dropout are set from this block's options.
  TORCH_ARG(nn::ConvNNAttentionOptions, convnn) = nn::ConvNNAttentionOptions(1, 1, 9);
  /// Bias of the attention projections (q, k, v and output), for every kind of attention.
  TORCH_ARG(bool, attention_bias) = true;
  /// Dropout after the attention and in the MLP.
  TORCH_ARG(double, dropout) = 0.0;
  /// MHSA: dropout on the attention weights; KVT / ConvNN: on the aggregated output.
  TORCH_ARG(double, attention_dropout) = 0.0;
  TORCH_ARG(double, drop_path) = 0.0;
  /// Key/value heads (grouped-query attention, every kind of attention); 0: num_heads.
  TORCH_ARG(int64_t, num_kv_heads) = 0;
  /// Causal attention (a decoder block): each token attends to itself and the tokens before it.
  TORCH_ARG(bool, causal) = false;
};

/// x + DropPath(Dropout(Attention(LayerNorm(x)))), then x + DropPath(MLP(LayerNorm(x))).
class TransformerBlockImpl : public torch::nn::Cloneable<TransformerBlockImpl> {
 public:
  explicit TransformerBlockImpl(TransformerBlockOptions options);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(const at::Tensor& input);
  /// The attention's key/value cache, and one decoding step of the block (causal blocks only):
  /// input [B,t,C] the next tokens of each sample, as the attentions' forward_step take them.
  nn::KVCache make_cache(int64_t batch, int64_t max_length) const;
  at::Tensor forward_step(const at::Tensor& input, nn::KVCache& cache, const std::vector<int64_t>& counts = {});
  void add_cost(CostReport& report, const std::string& stage, int64_t tokens) const;

  TransformerBlockOptions options;
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  /// SelfAttention or nn::ConvNNAttention.
  torch::nn::AnyModule attn;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout dropout{nullptr};
  DropPath drop_path{nullptr};
};
TORCH_MODULE(TransformerBlock);

/// The options of block `index` of a transformer whose options `o` (VisionTransformerOptions,
/// LanguageModelOptions) name its width, heads, MLP, attention, biases and dropouts; stochastic
/// depth grows linearly from 0 in the first block to o.drop_path() in the last (timm).
template <typename ModelOptions>
TransformerBlockOptions transformer_block_options(const ModelOptions& o, int64_t index) {
  const double drop_path = o.depth() > 1
                               ? o.drop_path() * static_cast<double>(index) / static_cast<double>(o.depth() - 1)
                               : o.drop_path();
  return TransformerBlockOptions(o.embed_dim(), o.num_heads())
      .mlp_dim(o.mlp_dim())
      .attention(o.attention())
      .convnn(o.convnn())
      .attention_bias(o.attention_bias())
      .dropout(o.dropout())
      .attention_dropout(o.attention_dropout())
      .drop_path(drop_path);
}

/// timm's (and GPT-2's) initialisation of every Linear inside `module`: weights N(0, 0.02), zero
/// biases (timm truncates at +-2, i.e. +-100 standard deviations: no truncation in practice).
void normal_init_linear_layers(torch::nn::Module& module);

struct VisionTransformerOptions {
  VisionTransformerOptions(int64_t embed_dim, int64_t depth, int64_t num_heads)
      : embed_dim_(embed_dim), depth_(depth), num_heads_(num_heads) {}
  /// 192 wide, 12 deep, 3 heads.
  static VisionTransformerOptions tiny() { return {192, 12, 3}; }
  /// 384 wide, 12 deep, 6 heads.
  static VisionTransformerOptions small() { return {384, 12, 6}; }
  /// ViT-B: 768 wide, 12 deep, 12 heads.
  static VisionTransformerOptions base() { return {768, 12, 12}; }
  /// ViT-L: 1024 wide, 24 deep, 16 heads.
  static VisionTransformerOptions large() { return {1024, 24, 16}; }

  TORCH_ARG(int64_t, embed_dim);
  TORCH_ARG(int64_t, depth);
  TORCH_ARG(int64_t, num_heads);
  TORCH_ARG(int64_t, image_size) = 224;
  TORCH_ARG(int64_t, patch_size) = 16;
  TORCH_ARG(int64_t, in_channels) = 3;
  TORCH_ARG(int64_t, num_classes) = 1000;
  TORCH_ARG(int64_t, mlp_dim) = 0;  // 0 = 4 * embed_dim
  TORCH_ARG(ViTAttention, attention) = ViTAttention::MHSA;
  /// Options of KVT / ConvNN attention (the paper's by default, K = 9).
  TORCH_ARG(nn::ConvNNAttentionOptions, convnn) = nn::ConvNNAttentionOptions(1, 1, 9);
  TORCH_ARG(PositionEmbedding, position_embedding) = PositionEmbedding::Learned;
  /// LayerNorm right after the patch embedding.
  TORCH_ARG(bool, patch_norm) = false;
  /// LayerNorm before the head.
  TORCH_ARG(bool, final_norm) = true;
  TORCH_ARG(bool, attention_bias) = true;
  /// On the embedded tokens, after the attention and in the MLP.
  TORCH_ARG(double, dropout) = 0.0;
  TORCH_ARG(double, attention_dropout) = 0.0;
  /// Stochastic depth of the last block; it grows linearly from 0 in the first.
  TORCH_ARG(double, drop_path) = 0.0;

 public:
  /// The paper authors' ViT: fixed sinusoidal position encoding, LayerNorm after the patch
  /// embedding, no final LayerNorm, bias-free attention projections.
  VisionTransformerOptions& paper_variant() {
    return position_embedding(PositionEmbedding::Sinusoidal)
        .patch_norm(true)
        .final_norm(false)
        .attention_bias(false);
  }
  /// Patches plus the class token.
  int64_t tokens() const;
};

class VisionTransformerImpl : public torch::nn::Cloneable<VisionTransformerImpl> {
 public:
  explicit VisionTransformerImpl(VisionTransformerOptions options);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// [B, in_channels, image_size, image_size] -> logits [B, num_classes].
  at::Tensor forward(const at::Tensor& input);
  /// Every operation for one image of the configured size (height and width must match it), and
  /// the parameters per stage (embed, blocks.i, head).
  CostReport cost(int64_t height, int64_t width) const;

  VisionTransformerOptions options;
  torch::nn::Conv2d patch_embed{nullptr};
  torch::nn::LayerNorm patch_norm{nullptr};
  at::Tensor cls_token;
  /// [1, N+1, D]: a parameter when learned, a buffer when sinusoidal.
  at::Tensor pos_embed;
  torch::nn::Dropout pos_drop{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(VisionTransformer);

/// The cost report's stage of a transformer's parameter: "blocks.i" for block i's, "head" for the
/// final norm's and the head's, "embed" for the rest (patch or token embedding, positions).
std::string transformer_stage(const std::string& parameter);

/// timm's LayerNorm epsilon for ViT, which the language models share.
inline constexpr double kLayerNormEps = 1e-6;
/// LayerNorm over the last `dim` channels with kLayerNormEps.
torch::nn::LayerNorm layer_norm(int64_t dim);

/// 1-D sin/cos position encoding [tokens, dim]: sin(p / 10000^(2i/dim)) in even channels, cos in
/// odd ones (Vaswani et al.).
at::Tensor sinusoidal_position_encoding(int64_t tokens, int64_t dim);

}  // namespace convnn::models
