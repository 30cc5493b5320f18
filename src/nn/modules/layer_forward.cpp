#include "nn/modules/layer_forward.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "convnn/nn/functional/convnn.h"
#include "nn/functional/spatial.h"
#include "nn/functional/symint_forms.h"
#include "nn/neighbours_detail.h"

namespace convnn::nn::detail {

at::Tensor apply_linear(const LinearTensors& linear, const at::Tensor& x) {
  return at::linear(x, linear.weight, linear.bias.defined() ? c10::optional<at::Tensor>(linear.bias) : c10::nullopt);
}

namespace {

// A convolution over x's spatial dimensions (2 or 3) with per-axis stride, padding and dilation:
// conv2d / conv3d, which autocast casts (at::convolution it does not).
at::Tensor apply_conv(const LinearTensors& conv, const at::Tensor& x, at::IntArrayRef stride, at::IntArrayRef padding,
                      at::IntArrayRef dilation) {
  const auto bias = conv.bias.defined() ? c10::optional<at::Tensor>(conv.bias) : c10::nullopt;
  if (x.dim() == 5) return at::conv3d(x, conv.weight, bias, stride, padding, dilation);
  return at::conv2d(x, conv.weight, bias, stride, padding, dilation);
}

// The shapes of the input (the batch B, the tokens N, for the spatial layers H and W) are read as
// SymInts only, so that torch.compile and torch.export keep them dynamic (see
// src/nn/functional/convnn.cpp); size() would specialise the traced program to one shape.

// As nn.Conv2d does: a channels_last input gives a channels_last output (the kernels' tokens
// come back NCHW-contiguous).
at::Tensor in_memory_format_of(const at::Tensor& input, const at::Tensor& output) {
  if (input.dim() != 4 || input.suggest_memory_format() != at::MemoryFormat::ChannelsLast) return output;
  return output.contiguous(at::MemoryFormat::ChannelsLast);
}

// As torch.nn's Conv1d, Conv2d and MultiheadAttention: an input without the batch dimension is one
// sample, run as a batch of one, and its output comes back without the batch dimension too.
bool is_one_sample(const at::Tensor& input, int64_t batched_dims) {
  return input.defined() && input.dim() == batched_dims - 1;
}

}  // namespace

void check_input_dtype(const char* layer, const at::Tensor& input, const at::Tensor& parameter) {
  // Under autocast the layer's ops cast their inputs themselves (an input may be bfloat16 while the
  // parameters stay float32), so the dtypes need not agree there.
  if (!input.defined() || !parameter.defined() || at::autocast::is_autocast_enabled(input.device().type())) return;
  TORCH_CHECK(input.scalar_type() == parameter.scalar_type(), layer, ": input is ", input.scalar_type(),
              " but the layer's parameters are ", parameter.scalar_type(),
              "; convert the input or the layer (module.to(dtype)) so that they match");
}

template <size_t D>
functional::ConvNNFuncOptions func_options(const ConvNNOptions<D>& o) {
  return functional::ConvNNFuncOptions(o.k())
      .similarity(o.similarity())
      .heads(o.heads())
      .alpha(o.alpha())
      .coordinates(o.coordinates())
      .padding(o.padding())
      .stride(std::vector<int64_t>(o.stride()->begin(), o.stride()->end()))
      .dilation(std::vector<int64_t>(o.dilation()->begin(), o.dilation()->end()))
      .num_candidates(o.num_candidates())
      .include_self(o.include_self())
      .slot_order(o.slot_order())
      .rho(o.rho())
      .temperature(o.temperature())
      .kernel_per_head(o.kernel_per_head())
      .fused(o.fused());
}

template <size_t D>
at::Tensor convnn_forward(const ConvNNOptions<D>& options, const at::Tensor& input,
                          const ConvNNTensors& tensors, c10::optional<at::Generator> generator,
                          Neighbours* neighbours) {
  const auto name = functional::detail::spatial_layer_name(D);
  if (is_one_sample(input, D + 2)) {
    auto output = convnn_forward(options, input.unsqueeze(0), tensors, std::move(generator), neighbours).squeeze(0);
    if (neighbours != nullptr) drop_batch_dimension(*neighbours);
    return output;
  }
  TORCH_CHECK(input.defined() && input.dim() == static_cast<int64_t>(D) + 2, name, ": input must be ",
              D + 2, "-D ", functional::detail::spatial_layout(D), " (or ", D + 1, "-D ",
              functional::detail::spatial_layout(D, /*batched=*/false), " for one sample), got ",
              input.defined() ? input.sym_sizes() : c10::SymIntArrayRef{});
  TORCH_SYM_CHECK(input.sym_size(1).sym_eq(options.in_channels()), name, ": input has ", input.sym_size(1),
                  " channels (dim 1), but in_channels = ", options.in_channels());
  check_input_dtype(name.c_str(), input, tensors.kernel);
  functional::detail::Projections projections;
  if (options.projection() == Projection::Linear) {
    projections.query = [&](const at::Tensor& t) { return apply_linear(tensors.query, t); };
    projections.key = [&](const at::Tensor& t) { return apply_linear(tensors.key, t); };
    projections.value = [&](const at::Tensor& t) { return apply_linear(tensors.value, t); };
  }
  auto o = func_options(options);
  o.generator(std::move(generator));
  functional::detail::Selection selection;
  const auto output = functional::detail::conv_nn_spatial(input, tensors.kernel, tensors.bias, o, D, projections,
                                                          neighbours != nullptr ? &selection : nullptr);
  if (neighbours != nullptr) {
    *neighbours = spatial_neighbours(selection, options.heads(), input.sizes().slice(2).vec(), options.padding(),
                                     o.stride(), o.dilation(), options.k());
  }
  return in_memory_format_of(input, output);
}

template functional::ConvNNFuncOptions func_options(const ConvNNOptions<1>&);
template functional::ConvNNFuncOptions func_options(const ConvNNOptions<2>&);
template functional::ConvNNFuncOptions func_options(const ConvNNOptions<3>&);
template at::Tensor convnn_forward(const ConvNNOptions<1>&, const at::Tensor&, const ConvNNTensors&,
                                   c10::optional<at::Generator>, Neighbours*);
template at::Tensor convnn_forward(const ConvNNOptions<2>&, const at::Tensor&, const ConvNNTensors&,
                                   c10::optional<at::Generator>, Neighbours*);
template at::Tensor convnn_forward(const ConvNNOptions<3>&, const at::Tensor&, const ConvNNTensors&,
                                   c10::optional<at::Generator>, Neighbours*);

void check_attention_input(const ConvNNAttentionOptions& o, const at::Tensor& input, const at::Tensor& weight) {
  TORCH_CHECK(input.defined() && (input.dim() == 3 || input.dim() == 2),
              "ConvNNAttention: input must be [B,N,C] (or [N,C] for one sample) with C = embed_dim = ",
              o.embed_dim(), ", got ", input.defined() ? input.sym_sizes() : c10::SymIntArrayRef{});
  TORCH_SYM_CHECK(input.sym_size(-1).sym_eq(o.embed_dim()),
                  "ConvNNAttention: input must be [B,N,C] with C = embed_dim = ", o.embed_dim(), ", got ",
                  input.sym_sizes());
  check_input_dtype("ConvNNAttention", input, weight);
}

functional::ConvNNFuncOptions attention_func_options(const ConvNNAttentionOptions& o) {
  return functional::ConvNNFuncOptions(o.k())
      .similarity(o.similarity())
      .heads(o.num_heads())
      .kv_heads(o.num_kv_heads())
      .num_candidates(o.num_candidates())
      .include_self(o.include_self())
      .slot_order(o.slot_order())
      .rho(o.rho())
      .temperature(o.temperature())
      .kernel_per_head(o.kernel_per_head())
      .fused(o.fused());
}

namespace {

// The keys and values of a sequence shorter than K, padded at their end to K rows that no query may
// select, with the mask's columns for them: each row then follows the op's short-row rule (its
// valid keys, then masked slots of weight exactly 0), as nn.MultiheadAttention takes a sequence of
// any length. Under tracing with a dynamic length the choice is a guard (M >= K or M < K), so that a
// compiled program serves both sides, each traced once (torch.compile recompiles when it crosses).
struct KeysOfK {
  at::Tensor keys, values, mask;
};

std::optional<KeysOfK> keys_padded_to_k(int64_t k, const at::Tensor& queries, const at::Tensor& keys,
                                        const at::Tensor& values, const at::Tensor& mask) {
  const c10::SymInt m = keys.sym_size(1);
  if (m.sym_ge(k).guard_bool(__FILE__, __LINE__)) return std::nullopt;
  const c10::SymInt missing = c10::SymInt(k) - m;
  const auto allowed = mask.defined() ? mask
                                      : at::ones_symint({queries.sym_size(1), m},
                                                        at::TensorOptions().dtype(at::kBool).device(keys.device()));
  const double hidden = allowed.scalar_type() == at::kBool ? 0.0 : -std::numeric_limits<double>::infinity();
  return KeysOfK{at::constant_pad_nd_symint(keys, {0, 0, 0, missing}),
                 at::constant_pad_nd_symint(values, {0, 0, 0, missing}),
                 at::constant_pad_nd_symint(allowed, {0, missing}, hidden)};
}

}  // namespace

at::Tensor attention_aggregate(const ConvNNAttentionOptions& o, const at::Tensor& queries, const at::Tensor& keys_in,
                               const at::Tensor& values_in, const AttentionTensors& tensors,
                               c10::optional<at::Generator> generator, bool training, Neighbours* neighbours) {
  if (is_one_sample(queries, 3)) {
    auto batched = tensors;  // a one-sample key_padding_mask [N] as the batch's [1,N]
    auto& padding = batched.masks.key_padding_mask;
    if (padding.defined() && padding.dim() == 1) padding = padding.unsqueeze(0);
    auto output = attention_aggregate(o, queries.unsqueeze(0), keys_in.unsqueeze(0), values_in.unsqueeze(0), batched,
                                      std::move(generator), training, neighbours)
                      .squeeze(0);
    if (neighbours != nullptr) drop_batch_dimension(*neighbours);
    return output;
  }
  TORCH_CHECK(queries.dim() == 3, "ConvNNAttention: the projected queries must be [B,N,C], got ",
              queries.sym_sizes());
  auto func = attention_func_options(o);
  auto keys = keys_in, values = values_in;
  auto mask = merged_attention_mask(o, tensors.masks, queries.sym_size(0), queries.sym_size(1), queries.device());
  if (auto padded = keys_padded_to_k(o.k(), queries, keys, values, mask)) {
    keys = padded->keys, values = padded->values, mask = padded->mask;
  }
  func.mask(mask);
  func.generator(std::move(generator));
  functional::detail::Selection selection;
  const auto aggregated = functional::detail::conv_nn_with_query_coordinates(
      queries, keys, values, tensors.kernel, tensors.bias, func, {}, {}, neighbours != nullptr ? &selection : nullptr);
  if (neighbours != nullptr) *neighbours = token_neighbours(selection, o.num_heads(), o.k());
  return at::dropout(aggregated, o.dropout(), training);
}

namespace {

// Whether the three projections can run as one matrix product: weights of one dtype and device, and
// biases on all three or none.
bool fusable(const LinearTensors& q, const LinearTensors& k, const LinearTensors& v) {
  const auto same = [&](const at::Tensor& a, const at::Tensor& b) {
    return a.scalar_type() == b.scalar_type() && a.device() == b.device();
  };
  const bool biases = q.bias.defined();
  return same(q.weight, k.weight) && same(q.weight, v.weight) && k.bias.defined() == biases &&
         v.bias.defined() == biases && (!biases || (same(q.bias, k.bias) && same(q.bias, v.bias)));
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> project_qkv(const AttentionTensors& tensors, const at::Tensor& input) {
  const auto &q = tensors.query, &k = tensors.key, &v = tensors.value;
  if (!fusable(q, k, v)) {
    // In this order, as the Python layer runs unfusable projections (C++ leaves the order of a
    // call's arguments open): autograd sums the input's three gradients in the reverse order.
    auto queries = apply_linear(q, input);
    auto keys = apply_linear(k, input);
    return {queries, keys, apply_linear(v, input)};
  }
  // One [3C, C] product, as timm's qkv: one GEMM forward and two backward instead of three and six
  // (with grouped heads the key and value rows are fewer: [C + 2 kv_heads*d, C]).
  const auto weight = at::cat({q.weight, k.weight, v.weight});
  const auto bias = q.bias.defined() ? at::cat({q.bias, k.bias, v.bias}) : at::Tensor();
  auto qkv = apply_linear({weight, bias}, input)
                 .split_with_sizes({q.weight.size(0), k.weight.size(0), v.weight.size(0)}, -1);
  return {qkv[0], qkv[1], qkv[2]};
}

at::Tensor attention_forward(const ConvNNAttentionOptions& o, const at::Tensor& input,
                             const AttentionTensors& tensors, c10::optional<at::Generator> generator,
                             bool training, Neighbours* neighbours) {
  check_attention_input(o, input, tensors.kernel);
  const auto [queries, keys, values] = project_qkv(tensors, input);
  const auto aggregated =
      attention_aggregate(o, queries, keys, values, tensors, std::move(generator), training, neighbours);
  return apply_linear(tensors.output, aggregated);
}

std::string branching_layer_name(int64_t spatial_dims) { return "BranchingConv" + std::to_string(spatial_dims) + "d"; }

template <size_t D>
int64_t convnn_branch_channels(const BranchingConvOptions<D>& options) {
  return static_cast<int64_t>(std::llround(options.lambda() * static_cast<double>(options.out_channels())));
}

template <size_t D>
ConvNNOptions<D> convnn_branch_options(const BranchingConvOptions<D>& options) {
  auto branch = options.convnn();
  branch.in_channels(options.in_channels()).out_channels(convnn_branch_channels(options));
  return branch;
}

template <size_t D>
at::Tensor branching_forward(const BranchingConvOptions<D>& options, const at::Tensor& input,
                             const BranchingTensors& tensors, c10::optional<at::Generator> generator,
                             Neighbours* neighbours) {
  const auto name = branching_layer_name(D);
  const char* batched = functional::detail::spatial_layout(D);
  if (is_one_sample(input, D + 2)) {
    auto output = branching_forward(options, input.unsqueeze(0), tensors, std::move(generator), neighbours).squeeze(0);
    if (neighbours != nullptr) drop_batch_dimension(*neighbours);
    return output;
  }
  TORCH_CHECK(input.defined() && input.dim() == static_cast<int64_t>(D) + 2, name, ": input must be ", batched,
              " (or ", functional::detail::spatial_layout(D, /*batched=*/false), " for one sample) with C = in_channels = ",
              options.in_channels(), ", got ", input.defined() ? input.sym_sizes() : c10::SymIntArrayRef{});
  TORCH_SYM_CHECK(input.sym_size(1).sym_eq(options.in_channels()),
                  name, ": input must be ", batched, " with C = in_channels = ", options.in_channels(),
                  ", got ", input.sym_sizes());
  check_input_dtype(name.c_str(), input, tensors.mix.weight);
  std::vector<at::Tensor> branches;
  if (tensors.convnn) {
    branches.push_back(
        convnn_forward(convnn_branch_options(options), input, *tensors.convnn, std::move(generator), neighbours));
  }
  // The convolution branch with the ConvNN branch's stride and dilation (same padding), so both give
  // ceil(size / stride) positions per axis; the 1x1 mix after them.
  const auto& branch = options.convnn();
  const std::vector<int64_t> stride(branch.stride()->begin(), branch.stride()->end());
  const std::vector<int64_t> dilation(branch.dilation()->begin(), branch.dilation()->end());
  std::vector<int64_t> padding;
  for (const int64_t d : dilation) padding.push_back(d * (options.kernel_size() / 2));
  if (tensors.conv.weight.defined()) branches.push_back(apply_conv(tensors.conv, input, stride, padding, dilation));
  const std::vector<int64_t> ones(D, 1), zeros(D, 0);
  return in_memory_format_of(
      input, apply_conv(tensors.mix, branches.size() == 1 ? branches[0] : at::cat(branches, 1), ones, zeros, ones));
}

template int64_t convnn_branch_channels(const BranchingConvOptions<2>&);
template int64_t convnn_branch_channels(const BranchingConvOptions<3>&);
template ConvNNOptions<2> convnn_branch_options(const BranchingConvOptions<2>&);
template ConvNNOptions<3> convnn_branch_options(const BranchingConvOptions<3>&);
template at::Tensor branching_forward(const BranchingConvOptions<2>&, const at::Tensor&, const BranchingTensors&,
                                      c10::optional<at::Generator>, Neighbours*);
template at::Tensor branching_forward(const BranchingConvOptions<3>&, const at::Tensor&, const BranchingTensors&,
                                      c10::optional<at::Generator>, Neighbours*);

}  // namespace convnn::nn::detail
