#pragma once
// ConvNN layers as LibTorch modules: Options / Impl / TORCH_MODULE, built in reset().
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <tuple>
#include <vector>
#include <type_traits>

#include "convnn/nn/functional/convnn.h"
#include "convnn/nn/kv_cache.h"
#include "convnn/nn/neighbours.h"
#include "convnn/nn/options/convnn.h"

namespace convnn::nn {
namespace detail {
struct ConvNNTensors;
}  // namespace detail

/// Draws for random candidates: the module's own generator in training (or the default one), and
/// a fixed or fresh draw in eval, as the options say.
class CandidateDraw {
 public:
  CandidateDraw() = default;
  CandidateDraw(c10::optional<uint64_t> seed, EvalCandidates eval, uint64_t eval_seed);
  /// With a training generator that the caller owns (the Python layers own theirs).
  static CandidateDraw with_generator(c10::optional<at::Generator> train_generator, EvalCandidates eval,
                                      uint64_t eval_seed);
  c10::optional<at::Generator> generator(bool training) const;

 private:
  c10::optional<at::Generator> train_generator_;
  EvalCandidates eval_ = EvalCandidates::Fixed;
  uint64_t eval_seed_ = 0;
};

/// Shared implementation of ConvNN1d, ConvNN2d and ConvNN3d.
template <size_t D, typename Derived>
class ConvNNNdImpl : public torch::nn::Cloneable<Derived>, public NeighbourRecording {
 public:
  explicit ConvNNNdImpl(ConvNNOptions<D> options);
  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(const at::Tensor& input);
  /// forward, and what it selected.
  std::tuple<at::Tensor, Neighbours> forward_with_neighbours(const at::Tensor& input);
  /// Checks that an input of these spatial sizes (D of them, before padding) leaves every query
  /// at least k candidates, as forward would; models call it when they are built. `layer` names
  /// this module in the error.
  void check_input_size(c10::IntArrayRef sizes, const std::string& layer) const;
  /// The tensors forward uses (kernel, bias, projections); for the library's own layers.
  detail::ConvNNTensors tensors() const;
  /// The generator of the random-candidate draw for the current mode (none: the default one).
  c10::optional<at::Generator> candidate_generator() const;

  ConvNNOptions<D> options;
  /// Aggregation kernel: [C'/H, C/H, K] (standard) or [C/H, K] (depthwise), with a leading H when
  /// kernel_per_head. A parameter when learnable_kernel, else a buffer of ones.
  at::Tensor kernel;
  at::Tensor bias;
  torch::nn::Linear query_projection{nullptr}, key_projection{nullptr}, value_projection{nullptr};

 private:
  at::Tensor run(const at::Tensor& input, Neighbours* neighbours);
  CandidateDraw draw_;
};

/// ConvNN on [B,C,L] -> [B,C',L].
class ConvNN1dImpl : public ConvNNNdImpl<1, ConvNN1dImpl> {
 public:
  using ConvNNNdImpl<1, ConvNN1dImpl>::ConvNNNdImpl;
  ConvNN1dImpl(int64_t in_channels, int64_t out_channels, int64_t k)
      : ConvNN1dImpl(ConvNN1dOptions(in_channels, out_channels, k)) {}
};
TORCH_MODULE(ConvNN1d);

/// ConvNN on [B,C,H,W] -> [B,C',H,W].
class ConvNN2dImpl : public ConvNNNdImpl<2, ConvNN2dImpl> {
 public:
  using ConvNNNdImpl<2, ConvNN2dImpl>::ConvNNNdImpl;
  ConvNN2dImpl(int64_t in_channels, int64_t out_channels, int64_t k)
      : ConvNN2dImpl(ConvNN2dOptions(in_channels, out_channels, k)) {}
};
TORCH_MODULE(ConvNN2d);

/// ConvNN on [B,C,D,H,W] -> [B,C',D,H,W]: the tokens are the volume's voxels, with coordinates of
/// the same step on all three axes.
class ConvNN3dImpl : public ConvNNNdImpl<3, ConvNN3dImpl> {
 public:
  using ConvNNNdImpl<3, ConvNN3dImpl>::ConvNNNdImpl;
  ConvNN3dImpl(int64_t in_channels, int64_t out_channels, int64_t k)
      : ConvNN3dImpl(ConvNN3dOptions(in_channels, out_channels, k)) {}
};
TORCH_MODULE(ConvNN3d);

namespace detail {
struct AttentionTensors;  // src/nn/modules/layer_forward.h
}  // namespace detail

/// Multi-head ConvNN attention on [B,N,C] -> [B,N,C].
class ConvNNAttentionImpl : public torch::nn::Cloneable<ConvNNAttentionImpl>, public NeighbourRecording {
 public:
  explicit ConvNNAttentionImpl(ConvNNAttentionOptions options);
  ConvNNAttentionImpl(int64_t embed_dim, int64_t num_heads, int64_t k)
      : ConvNNAttentionImpl(ConvNNAttentionOptions(embed_dim, num_heads, k)) {}
  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;
  /// input [B,N,C] (or [N,C]) -> the same shape. The call's masks (docs/sequences.md), as the Python
  /// layer's forward(x, attn_mask, is_causal, key_padding_mask) takes them:
  /// - attn_mask [N,N], [B,N,N] or [B,H,N,N] (B, H may be 1), as scaled_dot_product_attention's:
  ///   bool true = may be selected, or float added to the scores;
  /// - key_padding_mask [B,N] ([N] for one sample), as torch.nn.MultiheadAttention's: bool true =
  ///   a padding key that no query selects, or float added to the scores.
  /// Both combine with the options' mask and causal. A query with fewer than k selectable keys
  /// follows the op's short-row rule (docs/operator.md): its remaining slots weigh 0.
  at::Tensor forward(const at::Tensor& input, const at::Tensor& attn_mask = {},
                     const at::Tensor& key_padding_mask = {});
  /// forward, and what it selected (the token indices; on_token_grid places them on a grid).
  std::tuple<at::Tensor, Neighbours> forward_with_neighbours(const at::Tensor& input, const at::Tensor& attn_mask = {},
                                                             const at::Tensor& key_padding_mask = {});
  /// A packed batch of variable-length sequences, as FlashAttention's varlen functions take them:
  /// input [T,C], the S sequences' tokens concatenated, and cu_seqlens [S+1] (int64 or int32) their
  /// offsets (0, ..., T). Each query selects among its own sequence's keys (causal within it); equal
  /// to running each sequence alone, at the cost of the real tokens (docs/sequences.md).
  at::Tensor forward_packed(const at::Tensor& input, const at::Tensor& cu_seqlens);
  /// An empty key/value cache for incremental decoding: `batch` samples of up to `max_length` tokens,
  /// num_kv_heads * head_dim key and value channels, the dtype and device of the layer's parameters.
  KVCache make_cache(int64_t batch, int64_t max_length) const;
  /// One decoding step, causal whatever the options' causal says: input [B,t,C] are the next t
  /// tokens of each sample (sample b's first counts[b] of them; all t when counts is empty), which
  /// attend to the sample's cached tokens and to each other causally; their keys and values are
  /// appended to the cache. Equal to those rows of the causal forward on the whole prefix, at the
  /// cost O(t * (M * d + K * d)) for M cached tokens (docs/sequences.md). Rows past counts[b] are
  /// padding queries (computed, not meaningful).
  at::Tensor forward_step(const at::Tensor& input, KVCache& cache, const std::vector<int64_t>& counts = {});

  ConvNNAttentionOptions options;
  torch::nn::Linear query_projection{nullptr}, key_projection{nullptr},
      value_projection{nullptr}, output_projection{nullptr};
  torch::nn::Dropout dropout{nullptr};
  /// [d, K] depthwise or [d, d, K] standard (d = embed_dim / num_heads), leading H when per head.
  at::Tensor kernel;
  at::Tensor bias;

 private:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(at::Tensor())}, {2, torch::nn::AnyValue(at::Tensor())})
  at::Tensor run(const at::Tensor& input, const at::Tensor& attn_mask, const at::Tensor& key_padding_mask,
                 Neighbours* neighbours);
  detail::AttentionTensors tensors(const at::Tensor& attn_mask, const at::Tensor& key_padding_mask) const;
  CandidateDraw draw_;
};
TORCH_MODULE(ConvNNAttention);

/// Shared implementation of BranchingConv2d and BranchingConv3d.
template <size_t D, typename Derived>
class BranchingConvNdImpl : public torch::nn::Cloneable<Derived>, public NeighbourRecording {
 public:
  using ConvNNBranch = std::conditional_t<D == 2, ConvNN2d, ConvNN3d>;
  using Conv = std::conditional_t<D == 2, torch::nn::Conv2d, torch::nn::Conv3d>;

  explicit BranchingConvNdImpl(BranchingConvOptions<D> options);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(const at::Tensor& input);
  /// forward, and what its ConvNN branch selected (empty when lambda = 0).
  std::tuple<at::Tensor, Neighbours> forward_with_neighbours(const at::Tensor& input);
  /// check_input_size of the ConvNN branch, if there is one.
  void check_input_size(c10::IntArrayRef sizes, const std::string& layer) const;

  /// Output channels of the ConvNN branch: round(lambda * out_channels).
  int64_t convnn_channels() const;

  BranchingConvOptions<D> options;
  ConvNNBranch convnn_branch{nullptr};
  Conv conv_branch{nullptr};
  Conv mix{nullptr};

 private:
  at::Tensor run(const at::Tensor& input, Neighbours* neighbours);
};

/// The hybrid branching layer on [B,C,H,W] -> [B,C',H,W].
class BranchingConv2dImpl : public BranchingConvNdImpl<2, BranchingConv2dImpl> {
 public:
  using BranchingConvNdImpl<2, BranchingConv2dImpl>::BranchingConvNdImpl;
  BranchingConv2dImpl(int64_t in_channels, int64_t out_channels, int64_t k = 9)
      : BranchingConv2dImpl(BranchingConv2dOptions(in_channels, out_channels, k)) {}
};
TORCH_MODULE(BranchingConv2d);

/// The hybrid branching layer on volumes [B,C,D,H,W] -> [B,C',D,H,W].
class BranchingConv3dImpl : public BranchingConvNdImpl<3, BranchingConv3dImpl> {
 public:
  using BranchingConvNdImpl<3, BranchingConv3dImpl>::BranchingConvNdImpl;
  BranchingConv3dImpl(int64_t in_channels, int64_t out_channels, int64_t k = 27)
      : BranchingConv3dImpl(BranchingConv3dOptions(in_channels, out_channels, k)) {}
};
TORCH_MODULE(BranchingConv3d);

}  // namespace convnn::nn
