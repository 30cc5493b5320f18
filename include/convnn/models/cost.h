#pragma once
// Analytical cost of the models: MACs, other FLOPs and comparisons per operation, for one image,
// following the rules of docs/flops.md. LibTorch has no forward hooks, so every model walks its own
// layers and adds entries with the helpers below; nothing is executed.
#include <torch/nn/module.h>
#include <torch/nn/options/conv.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "convnn/models/geometry.h"
#include "convnn/nn/options/convnn.h"

namespace convnn::models {

/// The cost of one operation on one image (batch 1).
struct Cost {
  /// Multiply-accumulates of products of two operands: convolutions, linear layers, matrix
  /// products (similarity, attention scores, attention-weighted sums), ConvNN aggregation.
  int64_t macs = 0;
  /// Arithmetic outside the MACs: biases, normalisation, softmax, scaling, weighting, additions.
  int64_t other_flops = 0;
  /// Comparisons (top-k selection, max-pooling, ReLU, the max of a softmax): reported, never FLOPs.
  int64_t comparisons = 0;

  /// FLOPs = 2 * MACs + other FLOPs.
  int64_t flops() const { return 2 * macs + other_flops; }
  Cost& operator+=(const Cost& other);
};
Cost operator+(Cost a, const Cost& b);

/// One row of a report: one operation of one layer.
struct CostEntry {
  std::string stage;  // e.g. "stem", "layer1", "blocks.3", "head"
  std::string layer;  // module path, e.g. "layer1.0.conv2"
  std::string op;     // e.g. "conv2d", "similarity", "topk", "aggregation"
  Cost cost;
};

struct StageCost {
  std::string stage;
  int64_t parameters = 0;
  Cost cost;
};

/// Every operation of a model for one input size, and its parameters grouped by stage.
class CostReport {
 public:
  void add(const std::string& stage, const std::string& layer, const std::string& op, const Cost& cost);
  /// Adds every parameter of `module` (recursively) to the stage `stage_of(name)` names.
  void count_parameters(const torch::nn::Module& module,
                        const std::function<std::string(const std::string&)>& stage_of);

  const std::vector<CostEntry>& entries() const { return entries_; }
  /// Stages in the order they first appear (operations first, then parameter-only stages).
  std::vector<StageCost> stages() const;
  Cost total() const;
  int64_t parameters() const;

 private:
  std::vector<CostEntry> entries_;
  std::vector<std::pair<std::string, int64_t>> parameters_;
};

// ------------------------------------------------------------------ primitive operations

/// Conv2d producing an out_height x out_width map (padding must be explicit numbers).
Cost conv2d_cost(const torch::nn::detail::ConvNdOptions<2>& options, int64_t out_height, int64_t out_width);
/// `rows` rows through a Linear layer.
Cost linear_cost(int64_t rows, int64_t in_features, int64_t out_features, bool bias);
/// BatchNorm in its inference form: a scale and a shift per element.
Cost batch_norm_cost(int64_t elements);
Cost layer_norm_cost(int64_t elements, bool affine = true);
Cost relu_cost(int64_t elements);
Cost gelu_cost(int64_t elements);
/// Element-wise addition (residual connections, position embedding).
Cost addition_cost(int64_t elements);
Cost softmax_cost(int64_t elements);
Cost max_pool_cost(int64_t outputs, int64_t window);
/// Averaging `inputs` values into `outputs` means.
Cost mean_cost(int64_t inputs, int64_t outputs);
/// Top-k over `candidates` for each of `rows` rows: ceil(log2 k) comparisons (at least 1) per
/// candidate, the bound of a k-element heap.
int64_t topk_comparisons(int64_t rows, int64_t candidates, int64_t k);

/// Sizes of one ConvNN operator call on one image. Heads are folded into the batch before
/// selection; `qk_features` and the channels are totals over the heads.
struct ConvNNShape {
  int64_t queries = 0;     // N: output positions
  int64_t candidates = 0;  // M: all tokens, or r (+1 with include_self)
  int64_t heads = 1;
  int64_t qk_features = 0;   // similarity features (channels, plus coordinates per head)
  int64_t channels = 0;      // value channels C
  int64_t out_channels = 0;  // C' (= C for depthwise)
};
struct ConvNNOpSettings {
  Similarity similarity = Similarity::Cosine;
  int64_t k = 1;
  nn::Rho rho = nn::Rho::Uniform;
  double temperature = 1.0;
  nn::Aggregation aggregation = nn::Aggregation::Standard;
  bool bias = false;
};
/// The ConvNN operator as four entries: similarity (N x M scores), topk (comparisons only),
/// rho (the weights) and aggregation (weighting, Conv1d, bias).
void add_convnn_op(CostReport& report, const std::string& stage, const std::string& layer,
                   const ConvNNShape& shape, const ConvNNOpSettings& settings);

// ------------------------------------------------------------------ layers

/// Any 2-D layer of a ResNet slot: torch::nn::Conv2d, nn::ConvNN2d or nn::BranchingConv2d.
/// Adds its entries and updates height and width to the output size.
void add_spatial_layer(CostReport& report, const std::string& stage, const std::string& layer,
                       const torch::nn::Module& module, int64_t& height, int64_t& width);
/// nn::ConvNNAttention on `tokens` tokens: projections, the ConvNN operator, output projection.
void add_convnn_attention(CostReport& report, const std::string& stage, const std::string& layer,
                          const nn::ConvNNAttentionOptions& options, int64_t tokens);

}  // namespace convnn::models
