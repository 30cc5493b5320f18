#pragma once
// Options of the ConvNN operator and its layers, in the LibTorch frontend style (TORCH_ARG
// builders). Defaults follow the paper's CNN setup for the spatial layers and its ViT setup for
// ConvNNAttention. Semantics: docs/operator.md.
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/expanding_array.h>

#include <string_view>
#include <vector>

#include "convnn/ops/rho.h"
#include "convnn/ops/similarity.h"

namespace convnn::nn {

/// rho, the map from the K selected scores to aggregation weights (convnn/ops/rho.h).
using convnn::Rho;
/// Order of the K slots of a row: by descending score, or by ascending candidate index (the order
/// that makes standard-aggregation taps line up with convolution taps).
enum class SlotOrder { Score, Index };
/// Standard: kernel [C',C,K], mixes channels. Depthwise: kernel [C,K], C' = C.
enum class Aggregation { Standard, Depthwise };
/// In eval mode, random candidates are either one fixed draw (seeded by eval_seed) or a fresh draw
/// per forward, as in training.
enum class EvalCandidates { Fixed, Fresh };
/// Initialisation of the aggregation kernel: Conv1d's default (Kaiming-uniform, a = sqrt(5)), or all
/// ones (so that ConvNN attention starts as KVT / attention).
enum class KernelInit { Default, Ones };
/// Q/K/V projections: identity (the paper's CNN side) or learned linear maps.
enum class Projection { Identity, Linear };

using convnn::parse_rho;
using convnn::to_string;
SlotOrder parse_slot_order(std::string_view name);
Aggregation parse_aggregation(std::string_view name);
EvalCandidates parse_eval_candidates(std::string_view name);
KernelInit parse_kernel_init(std::string_view name);
Projection parse_projection(std::string_view name);
const char* to_string(SlotOrder value);
const char* to_string(Aggregation value);
const char* to_string(EvalCandidates value);
const char* to_string(KernelInit value);
const char* to_string(Projection value);
/// Each enum's names in enum order, from the one table that parse_* and to_string read: the list
/// the command line's choices, configs and the tests read.
const std::vector<std::string>& slot_order_names();
const std::vector<std::string>& aggregation_names();
const std::vector<std::string>& eval_candidates_names();
const std::vector<std::string>& kernel_init_names();
const std::vector<std::string>& projection_names();

namespace functional {

/// Options of the ConvNN operator on token sequences (functional::conv_nn) and on spatial maps
/// (functional::conv_nn1d / conv_nn2d / conv_nn3d).
struct ConvNNFuncOptions {
  /* implicit */ ConvNNFuncOptions(int64_t k) : k_(k) {}

  /// Number of neighbours K.
  TORCH_ARG(int64_t, k);
  TORCH_ARG(Similarity, similarity) = Similarity::Cosine;
  /// Heads folded into the batch before selection; query/key/value channels split evenly.
  TORCH_ARG(int64_t, heads) = 1;
  /// Key/value heads (token forms only): 0 = heads. Fewer than `heads` (dividing it) is grouped-
  /// query attention: keys and values carry kv_heads heads, and query head h reads key/value head
  /// h / (heads / kv_heads) (1 = multi-query attention).
  TORCH_ARG(int64_t, kv_heads) = 0;
  /// Weight of the feature similarity against the positional one when coordinates are present:
  /// the similarity features are [sqrt(alpha) q, sqrt(1-alpha) p]. 1 = features only
  /// (attention), 0 = coordinates only (convolution).
  TORCH_ARG(double, alpha) = 1.0;
  /// Spatial forms only: append normalised grid coordinates (same step on every axis).
  TORCH_ARG(bool, coordinates) = false;
  /// Spatial forms only: zero padding on every side before the search; the padded positions
  /// stay selectable and their outputs are cropped away.
  TORCH_ARG(int64_t, padding) = 0;
  /// Spatial forms only: queries on every stride-th position of each axis, so the output is
  /// downsampled as a strided convolution's (ceil(size / stride) positions). One value for every
  /// axis, or one per axis.
  TORCH_ARG(std::vector<int64_t>, stride) = std::vector<int64_t>{1};
  /// Spatial forms only: each query's candidates are the positions a multiple of the dilation away
  /// on every axis (its dilated grid), with coordinates on that grid (one dilated step is one
  /// unit), as a dilated convolution's window. One value for every axis, or one per axis.
  TORCH_ARG(std::vector<int64_t>, dilation) = std::vector<int64_t>{1};
  /// Optional mask, bool (true = may be selected) or additive float: [N,M], [B,N,M] (per sample,
  /// for each of its heads) or [B*heads,N,M].
  TORCH_ARG(at::Tensor, mask) = {};
  /// Random candidates: 0 = all M candidates, else r < M drawn without replacement per call,
  /// shared across the batch.
  TORCH_ARG(int64_t, num_candidates) = 0;
  /// With random candidates, always add the query itself (never twice, with its real score).
  TORCH_ARG(bool, include_self) = false;
  /// Generator for the candidate draw; the default CPU generator when unset.
  TORCH_ARG(c10::optional<at::Generator>, generator) = c10::nullopt;
  TORCH_ARG(SlotOrder, slot_order) = SlotOrder::Score;
  TORCH_ARG(Rho, rho) = Rho::Uniform;
  TORCH_ARG(double, temperature) = 1.0;
  /// The kernel (and bias) carry a leading head dimension: one per head instead of shared.
  TORCH_ARG(bool, kernel_per_head) = false;
  /// Run select, rho and aggregate as the one fused op convnn::knn_attention; false composes
  /// knn_select, rho and knn_aggregate (the same result). kernel_per_head and include_self with
  /// random candidates always compose.
  TORCH_ARG(bool, fused) = true;
};

}  // namespace functional

/// Options shared by ConvNN1d, ConvNN2d and ConvNN3d.
template <size_t D>
struct ConvNNOptions {
  ConvNNOptions(int64_t in_channels, int64_t out_channels, int64_t k)
      : in_channels_(in_channels), out_channels_(out_channels), k_(k) {}

  TORCH_ARG(int64_t, in_channels);
  TORCH_ARG(int64_t, out_channels);
  TORCH_ARG(int64_t, k);
  TORCH_ARG(Similarity, similarity) = Similarity::Cosine;
  TORCH_ARG(int64_t, heads) = 1;
  TORCH_ARG(bool, coordinates) = false;
  TORCH_ARG(double, alpha) = 1.0;
  TORCH_ARG(int64_t, padding) = 0;
  /// Queries on every stride-th position of each axis (functional::ConvNNFuncOptions::stride).
  TORCH_ARG(torch::ExpandingArray<D>, stride) = 1;
  /// Candidates on each query's dilated grid (functional::ConvNNFuncOptions::dilation).
  TORCH_ARG(torch::ExpandingArray<D>, dilation) = 1;
  TORCH_ARG(int64_t, num_candidates) = 0;
  TORCH_ARG(bool, include_self) = false;
  TORCH_ARG(EvalCandidates, eval_candidates) = EvalCandidates::Fixed;
  /// Seed of the fixed eval draw.
  TORCH_ARG(uint64_t, eval_seed) = 0;
  /// Seed of the module's own training-time generator; the default CPU generator when unset.
  TORCH_ARG(c10::optional<uint64_t>, seed) = c10::nullopt;
  TORCH_ARG(SlotOrder, slot_order) = SlotOrder::Score;
  TORCH_ARG(Rho, rho) = Rho::Uniform;
  TORCH_ARG(double, temperature) = 1.0;
  TORCH_ARG(Aggregation, aggregation) = Aggregation::Standard;
  /// false: the kernel is a buffer fixed to ones (KVT-style), not a parameter.
  TORCH_ARG(bool, learnable_kernel) = true;
  TORCH_ARG(KernelInit, kernel_init) = KernelInit::Default;
  TORCH_ARG(bool, kernel_per_head) = false;
  /// Fused select + rho + aggregate (functional::ConvNNFuncOptions::fused).
  TORCH_ARG(bool, fused) = true;
  TORCH_ARG(bool, bias) = false;
  TORCH_ARG(Projection, projection) = Projection::Identity;
  /// Channels of the query/key projection (Linear projection only); 0 = in_channels.
  TORCH_ARG(int64_t, qk_channels) = 0;
  TORCH_ARG(bool, projection_bias) = false;
};

using ConvNN1dOptions = ConvNNOptions<1>;
using ConvNN2dOptions = ConvNNOptions<2>;
using ConvNN3dOptions = ConvNNOptions<3>;

/// Multi-head ConvNN attention on [B,N,C], a drop-in for multi-head self-attention. Defaults are
/// the paper's ViT: bias-free Q/K/V/O, scaled_dot, softmax rho, depthwise kernel initialised to 1
/// and shared across heads, dropout on the aggregated output.
struct ConvNNAttentionOptions {
  ConvNNAttentionOptions(int64_t embed_dim, int64_t num_heads, int64_t k)
      : embed_dim_(embed_dim), num_heads_(num_heads), k_(k) {}

  TORCH_ARG(int64_t, embed_dim);
  TORCH_ARG(int64_t, num_heads);
  TORCH_ARG(int64_t, k);
  /// Key/value heads, 0 = num_heads: fewer (dividing num_heads) is grouped-query attention, 1
  /// multi-query attention. The key and value projections then give num_kv_heads * head_dim
  /// channels, and each group of num_heads / num_kv_heads query heads shares one key/value head.
  TORCH_ARG(int64_t, num_kv_heads) = 0;
  TORCH_ARG(Similarity, similarity) = Similarity::ScaledDot;
  TORCH_ARG(Rho, rho) = Rho::Softmax;
  TORCH_ARG(double, temperature) = 1.0;
  TORCH_ARG(SlotOrder, slot_order) = SlotOrder::Score;
  TORCH_ARG(Aggregation, aggregation) = Aggregation::Depthwise;
  TORCH_ARG(bool, learnable_kernel) = true;
  TORCH_ARG(KernelInit, kernel_init) = KernelInit::Ones;
  TORCH_ARG(bool, kernel_per_head) = false;
  /// Fused select + softmax + aggregate, convnn::knn_attention (the default); false composes
  /// knn_select, rho and knn_aggregate (functional::ConvNNFuncOptions::fused).
  TORCH_ARG(bool, fused) = true;
  TORCH_ARG(bool, bias) = false;
  TORCH_ARG(bool, qkv_bias) = false;
  TORCH_ARG(bool, out_bias) = false;
  TORCH_ARG(double, dropout) = 0.0;
  TORCH_ARG(bool, causal) = false;
  /// Fixed [N,N] mask (bool or additive), combined with causal when both are set.
  TORCH_ARG(at::Tensor, mask) = {};
  TORCH_ARG(int64_t, num_candidates) = 0;
  TORCH_ARG(bool, include_self) = false;
  TORCH_ARG(EvalCandidates, eval_candidates) = EvalCandidates::Fixed;
  TORCH_ARG(uint64_t, eval_seed) = 0;
  TORCH_ARG(c10::optional<uint64_t>, seed) = c10::nullopt;
};

/// The key/value heads a ConvNNAttention has: num_kv_heads, or num_heads when it is 0.
inline int64_t key_value_heads(const ConvNNAttentionOptions& o) {
  return o.num_kv_heads() == 0 ? o.num_heads() : o.num_kv_heads();
}

/// The hybrid branching layer: a ConvNN branch with round(lambda * out_channels) channels, first,
/// and a 3x3 (3x3x3) convolution branch (with bias) with the rest, concatenated and mixed by a 1x1
/// (1x1x1) convolution with bias. lambda 0 or 1 builds one branch; the mix stays. D = 2:
/// BranchingConv2d on [B,C,H,W]; D = 3: BranchingConv3d on [B,C,D,H,W]. K defaults to the
/// convolution window's size, 3^D.
template <size_t D>
struct BranchingConvOptions {
  BranchingConvOptions(int64_t in_channels, int64_t out_channels, int64_t k = D == 3 ? 27 : 9)
      : in_channels_(in_channels), out_channels_(out_channels),
        convnn_(ConvNNOptions<D>(in_channels, out_channels, k).padding(1)) {}

  TORCH_ARG(int64_t, in_channels);
  TORCH_ARG(int64_t, out_channels);
  TORCH_ARG(double, lambda) = 0.5;
  /// Kernel size of the convolution branch (odd; same padding).
  TORCH_ARG(int64_t, kernel_size) = 3;
  /// The ConvNN branch's options; its channel counts are set from in_channels and lambda.
  TORCH_ARG(ConvNNOptions<D>, convnn);
};

using BranchingConv2dOptions = BranchingConvOptions<2>;
using BranchingConv3dOptions = BranchingConvOptions<3>;

}  // namespace convnn::nn
