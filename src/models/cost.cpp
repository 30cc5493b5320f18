// The counting rules of docs/flops.md, once. Every number is for one image.
#include "convnn/models/cost.h"

#include "convnn/ops/cost.h"

#include <c10/util/Exception.h>
#include <torch/nn/modules/conv.h>

#include <algorithm>

#include "convnn/nn/modules/convnn.h"

namespace convnn::models {

Cost& Cost::operator+=(const Cost& other) {
  macs += other.macs;
  other_flops += other.other_flops;
  comparisons += other.comparisons;
  return *this;
}

Cost operator+(Cost a, const Cost& b) { return a += b; }

void CostReport::add(const std::string& stage, const std::string& layer, const std::string& op,
                     const Cost& cost) {
  entries_.push_back({stage, layer, op, cost});
}

void CostReport::count_parameters(const torch::nn::Module& module,
                                  const std::function<std::string(const std::string&)>& stage_of) {
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const auto stage = stage_of(item.key());
    auto it =
        std::find_if(parameters_.begin(), parameters_.end(), [&](const auto& p) { return p.first == stage; });
    if (it == parameters_.end()) it = parameters_.insert(parameters_.end(), {stage, 0});
    it->second += item.value().numel();
  }
}

std::vector<StageCost> CostReport::stages() const {
  std::vector<StageCost> stages;
  auto stage_named = [&](const std::string& name) -> StageCost& {
    auto it = std::find_if(stages.begin(), stages.end(), [&](const auto& s) { return s.stage == name; });
    if (it == stages.end()) it = stages.insert(stages.end(), StageCost{name, 0, {}});
    return *it;
  };
  for (const auto& e : entries_) stage_named(e.stage).cost += e.cost;
  for (const auto& [stage, count] : parameters_) stage_named(stage).parameters += count;
  return stages;
}

Cost CostReport::total() const {
  Cost total;
  for (const auto& e : entries_) total += e.cost;
  return total;
}

int64_t CostReport::parameters() const {
  int64_t total = 0;
  for (const auto& p : parameters_) total += p.second;
  return total;
}

// ------------------------------------------------------------------ primitive operations

Cost conv2d_cost(const torch::nn::detail::ConvNdOptions<2>& o, int64_t out_height, int64_t out_width) {
  const int64_t outputs = out_height * out_width * o.out_channels();
  const int64_t taps = (o.in_channels() / o.groups()) * o.kernel_size()->at(0) * o.kernel_size()->at(1);
  return {outputs * taps, o.bias() ? outputs : 0, 0};
}

Cost linear_cost(int64_t rows, int64_t in_features, int64_t out_features, bool bias) {
  return {rows * in_features * out_features, bias ? rows * out_features : 0, 0};
}

Cost batch_norm_cost(int64_t elements) { return {0, 2 * elements, 0}; }

// Mean (1), centring (1), square and sum (2), scaling by the inverse deviation (1); the affine
// scale and shift add 2.
Cost layer_norm_cost(int64_t elements, bool affine) { return {0, (affine ? 7 : 5) * elements, 0}; }

Cost relu_cost(int64_t elements) { return {0, 0, elements}; }

// x/sqrt(2), erf, +1, times x, halved: 5, a transcendental counting as 1 like every other op.
Cost gelu_cost(int64_t elements) { return {0, 5 * elements, 0}; }

Cost addition_cost(int64_t elements) { return {0, elements, 0}; }

// Subtract the max, exp, sum, divide: 4 FLOPs; finding the max: 1 comparison.
Cost softmax_cost(int64_t elements) { return {0, 4 * elements, elements}; }

Cost max_pool_cost(int64_t outputs, int64_t window) { return {0, 0, outputs * (window - 1)}; }

// inputs - outputs additions and one division per mean.
Cost mean_cost(int64_t inputs, int64_t outputs) { return {0, inputs, 0}; }

int64_t topk_comparisons(int64_t rows, int64_t candidates, int64_t k) {
  return ops::topk_comparisons(rows, candidates, k);
}

// The operator's rules are ops::knn_call_cost's (include/convnn/ops/cost.h).
void add_convnn_op(CostReport& report, const std::string& stage, const std::string& layer,
                   const ConvNNShape& s, const ConvNNOpSettings& o) {
  const auto as_cost = [](const ops::OpCost& c) { return Cost{c.macs, c.other_flops, c.comparisons}; };
  const auto call = ops::knn_call_cost(
      {s.queries, s.candidates, s.heads, s.qk_features, s.channels, s.out_channels},
      {o.similarity, o.k, o.rho, o.temperature, o.aggregation == nn::Aggregation::Depthwise, o.bias});
  report.add(stage, layer, "similarity", as_cost(call.similarity));
  report.add(stage, layer, "topk", as_cost(call.topk));
  if (call.rho) report.add(stage, layer, "rho", as_cost(*call.rho));
  report.add(stage, layer, "aggregation", as_cost(call.aggregation));
}

// ------------------------------------------------------------------ layers

namespace {

void add_conv2d(CostReport& report, const std::string& stage, const std::string& layer,
                const torch::nn::Conv2dImpl& conv, int64_t& height, int64_t& width) {
  advance_spatial_layer(conv, layer, height, width);
  report.add(stage, layer, "conv2d", conv2d_cost(conv.options, height, width));
}

// ConvNN2d counts useful work: queries at the output positions only (H x W, or ceil(H / stride) x
// ceil(W / stride); the layer also searches for the padded positions and crops them away),
// candidates on the padded grid, or with dilation on a query's phase of the dilated grid (the
// largest phase: an upper bound where the padded size is not a multiple of the dilation).
void add_convnn2d(CostReport& report, const std::string& stage, const std::string& layer,
                  const nn::ConvNN2dImpl& convnn, int64_t height, int64_t width) {
  convnn.check_input_size({height, width}, layer);  // k beyond the candidates has no cost
  const auto& o = convnn.options;
  const auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const int64_t n = cdiv(height, o.stride()->at(0)) * cdiv(width, o.stride()->at(1));
  const int64_t grid = (height + 2 * o.padding()) * (width + 2 * o.padding());
  const int64_t phase = cdiv(height + 2 * o.padding(), o.dilation()->at(0)) *
                        cdiv(width + 2 * o.padding(), o.dilation()->at(1));
  const int64_t m = o.num_candidates() > 0 ? o.num_candidates() + (o.include_self() ? 1 : 0) : phase;
  const bool linear = o.projection() == nn::Projection::Linear;
  const int64_t qk = linear && o.qk_channels() > 0 ? o.qk_channels() : o.in_channels();
  if (linear) {
    const bool b = o.projection_bias();
    report.add(stage, layer + ".query_projection", "linear", linear_cost(n, o.in_channels(), qk, b));
    report.add(stage, layer + ".key_projection", "linear", linear_cost(grid, o.in_channels(), qk, b));
    report.add(stage, layer + ".value_projection", "linear",
               linear_cost(grid, o.in_channels(), o.in_channels(), b));
  }
  const int64_t coordinates = o.coordinates() ? 2 * o.heads() : 0;
  add_convnn_op(report, stage, layer, {n, m, o.heads(), qk + coordinates, o.in_channels(), o.out_channels()},
                {o.similarity(), o.k(), o.rho(), o.temperature(), o.aggregation(), o.bias()});
}

}  // namespace

void add_spatial_layer(CostReport& report, const std::string& stage, const std::string& layer,
                       const torch::nn::Module& module, int64_t& height, int64_t& width) {
  if (const auto* conv = dynamic_cast<const torch::nn::Conv2dImpl*>(&module)) {
    add_conv2d(report, stage, layer, *conv, height, width);
  } else if (const auto* convnn = dynamic_cast<const nn::ConvNN2dImpl*>(&module)) {
    add_convnn2d(report, stage, layer, *convnn, height, width);
    advance_spatial_layer(module, layer, height, width);
  } else if (const auto* branching = dynamic_cast<const nn::BranchingConv2dImpl*>(&module)) {
    // Both branches see the whole input and give its size divided by the stride; the concatenation
    // is free; the mix runs at the output size.
    if (!branching->convnn_branch.is_empty()) {
      add_convnn2d(report, stage, layer + ".convnn_branch", *branching->convnn_branch, height, width);
    }
    if (!branching->conv_branch.is_empty()) {
      int64_t h = height, w = width;
      add_conv2d(report, stage, layer + ".conv_branch", *branching->conv_branch, h, w);
    }
    const auto& stride = branching->options.convnn().stride();
    int64_t h = (height + stride->at(0) - 1) / stride->at(0), w = (width + stride->at(1) - 1) / stride->at(1);
    add_conv2d(report, stage, layer + ".mix", *branching->mix, h, w);
    advance_spatial_layer(module, layer, height, width);
  } else {
    TORCH_CHECK(false, layer, ": the cost counter knows Conv2d, ConvNN2d and BranchingConv2d, got ",
                module.name());
  }
}

void add_convnn_attention(CostReport& report, const std::string& stage, const std::string& layer,
                          const nn::ConvNNAttentionOptions& o, int64_t tokens) {
  const int64_t c = o.embed_dim();
  // Projections apply to every token: each token is a query, and candidates are drawn from all.
  // With grouped heads the key and value projections give num_kv_heads * head_dim channels.
  const int64_t kv_channels = c / o.num_heads() * nn::key_value_heads(o);
  report.add(stage, layer + ".qkv_projections", "linear",
             linear_cost(tokens, c, c + 2 * kv_channels, o.qkv_bias()));
  const int64_t m = o.num_candidates() > 0 ? o.num_candidates() + (o.include_self() ? 1 : 0) : tokens;
  add_convnn_op(report, stage, layer, {tokens, m, o.num_heads(), c, c, c},
                {o.similarity(), o.k(), o.rho(), o.temperature(), o.aggregation(), o.bias()});
  report.add(stage, layer + ".output_projection", "linear", linear_cost(tokens, c, c, o.out_bias()));
}

}  // namespace convnn::models
