#include "convnn/models/vit.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/functional/activation.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "convnn/nn/modules/convnn.h"
#include "util/enum_names.h"

namespace convnn::models {
namespace {

constexpr convnn::detail::NameTable<ViTAttention, 3> kAttention{
    {{"mhsa", ViTAttention::MHSA}, {"kvt", ViTAttention::KVT}, {"convnn", ViTAttention::ConvNN}}};
constexpr convnn::detail::NameTable<PositionEmbedding, 2> kPositionEmbedding{
    {{"learned", PositionEmbedding::Learned}, {"sinusoidal", PositionEmbedding::Sinusoidal}}};

void check_dropout(double p, const char* module, const char* option) {
  TORCH_CHECK(p >= 0.0 && p < 1.0, module, ": ", option, " must be in [0, 1), got ", p);
}

const char* yes_no(bool b) { return b ? "true" : "false"; }

}  // namespace

ViTAttention parse_vit_attention(std::string_view name) {
  return convnn::detail::parse_name(kAttention, name, "attention");
}
PositionEmbedding parse_position_embedding(std::string_view name) {
  return convnn::detail::parse_name(kPositionEmbedding, name, "position_embedding");
}
const char* to_string(ViTAttention attention) { return convnn::detail::name_of(kAttention, attention); }
const char* to_string(PositionEmbedding embedding) { return convnn::detail::name_of(kPositionEmbedding, embedding); }
const std::vector<std::string>& vit_attention_names() { return convnn::detail::table_names<kAttention>(); }
const std::vector<std::string>& position_embedding_names() {
  return convnn::detail::table_names<kPositionEmbedding>();
}

void normal_init_linear_layers(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  for (const auto& child : module.modules(/*include_self=*/false)) {
    if (auto* linear = child->as<torch::nn::Linear>()) {
      linear->weight.normal_(0.0, 0.02);
      if (linear->bias.defined()) linear->bias.zero_();
    }
  }
}

std::string transformer_stage(const std::string& parameter) {
  if (parameter.rfind("blocks.", 0) == 0) return parameter.substr(0, parameter.find('.', 7));
  if (parameter.rfind("norm.", 0) == 0 || parameter.rfind("head.", 0) == 0) return "head";
  return "embed";
}

torch::nn::LayerNorm layer_norm(int64_t dim) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(kLayerNormEps));
}

at::Tensor sinusoidal_position_encoding(int64_t tokens, int64_t dim) {
  const auto position = at::arange(tokens, at::kDouble).unsqueeze(1);
  const auto frequency = at::exp(at::arange(0, dim, 2, at::kDouble) * (-std::log(10000.0) / dim));
  const auto angles = position * frequency;  // [tokens, ceil(dim / 2)]
  auto encoding = at::zeros({tokens, dim}, at::kDouble);
  encoding.slice(1, 0, dim, 2).copy_(at::sin(angles));
  encoding.slice(1, 1, dim, 2).copy_(at::cos(angles).slice(1, 0, dim / 2));
  return encoding.to(at::kFloat);
}

// ----------------------------------------------------------------------------- SelfAttention

SelfAttentionImpl::SelfAttentionImpl(SelfAttentionOptions options_) : options(std::move(options_)) {
  reset();
}

void SelfAttentionImpl::reset() {
  const auto& o = options;
  TORCH_CHECK(o.embed_dim() >= 1 && o.num_heads() >= 1 && o.embed_dim() % o.num_heads() == 0,
              "SelfAttention: num_heads = ", o.num_heads(),
              " must be at least 1 and divide embed_dim = ", o.embed_dim());
  check_dropout(o.dropout(), "SelfAttention", "dropout");
  TORCH_CHECK(o.num_kv_heads() >= 0 && o.num_heads() % o.kv_heads() == 0, "SelfAttention: num_kv_heads = ",
              o.num_kv_heads(), " must divide num_heads = ", o.num_heads(), " (or be 0: num_heads)");
  const int64_t kv_channels = o.kv_heads() * (o.embed_dim() / o.num_heads());
  qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(o.embed_dim(), o.embed_dim() + 2 * kv_channels)
                                                     .bias(o.bias())));
  proj = register_module(
      "proj", torch::nn::Linear(torch::nn::LinearOptions(o.embed_dim(), o.embed_dim()).bias(o.bias())));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> SelfAttentionImpl::project(const at::Tensor& input) {
  const int64_t b = input.size(0), n = input.size(1), c = input.size(2), h = options.num_heads();
  const int64_t kv = options.kv_heads(), d = c / h;
  const auto fused = qkv(input);
  const auto heads = [&](int64_t start, int64_t count) {
    return fused.narrow(2, start, count * d).view({b, n, count, d}).transpose(1, 2);  // [B,count,N,d]
  };
  return {heads(0, h), heads(c, kv), heads(c + kv * d, kv)};
}

at::Tensor SelfAttentionImpl::forward(const at::Tensor& input) {
  TORCH_CHECK(input.defined() && input.dim() == 3 && input.size(2) == options.embed_dim(),
              "SelfAttention: input must be [B,N,C] with C = embed_dim = ", options.embed_dim(), ", got ",
              input.defined() ? input.sizes() : c10::IntArrayRef{});
  const auto [q, k, v] = project(input);
  const auto out = at::scaled_dot_product_attention(q, k, v, {}, is_training() ? options.dropout() : 0.0,
                                                    options.causal(), std::nullopt,
                                                    /*enable_gqa=*/options.kv_heads() != options.num_heads());
  return proj(out.transpose(1, 2).reshape(input.sizes()));
}

nn::KVCache SelfAttentionImpl::make_cache(int64_t batch, int64_t max_length) const {
  const int64_t d = options.embed_dim() / options.num_heads();
  return nn::KVCache(batch, max_length, options.kv_heads(), d, d, qkv->weight.options());
}

at::Tensor SelfAttentionImpl::forward_step(const at::Tensor& input, nn::KVCache& cache,
                                           const std::vector<int64_t>& counts) {
  TORCH_CHECK(input.defined() && input.dim() == 3 && input.size(2) == options.embed_dim() &&
                  input.size(0) == cache.batch(),
              "SelfAttention.forward_step: input must be [B,t,C] with B = the cache's batch = ", cache.batch(),
              " and C = embed_dim = ", options.embed_dim(), ", got ",
              input.defined() ? input.sizes() : c10::IntArrayRef{});
  const auto [q, k, v] = project(input);
  const auto before = cache.append(flat_heads(k), flat_heads(v), counts);
  const auto out = attend_to_cache(q, cache.keys(), cache.values(), before);
  return proj(out.transpose(1, 2).reshape(input.sizes()));
}

at::Tensor flat_heads(const at::Tensor& heads) {
  return heads.transpose(1, 2).flatten(2);  // [B,h,t,d] -> [B,t,h*d]
}

at::Tensor attend_to_cache(const at::Tensor& queries, const at::Tensor& cache_keys, const at::Tensor& cache_values,
                           const std::vector<int64_t>& lengths_before) {
  const int64_t b = queries.size(0), t = queries.size(2);
  const int64_t held =
      std::min(cache_keys.size(2), *std::max_element(lengths_before.begin(), lengths_before.end()) + t);
  const auto longs = queries.options().dtype(at::kLong);
  // Query i of sample b sees the keys up to its own position, lengths_before[b] + i.
  const auto position =
      at::tensor(lengths_before, at::kLong).to(queries.device()).view({b, 1, 1, 1}) + at::arange(t, longs).view({1, 1, t, 1});
  const auto mask = at::arange(held, longs).view({1, 1, 1, held}) <= position;
  return at::scaled_dot_product_attention(queries, cache_keys.narrow(2, 0, held), cache_values.narrow(2, 0, held), mask,
                                          0.0, false, std::nullopt,
                                          /*enable_gqa=*/queries.size(1) != cache_keys.size(1));
}

void SelfAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "convnn::models::SelfAttention(embed_dim=" << options.embed_dim()
         << ", num_heads=" << options.num_heads() << ", num_kv_heads=" << options.kv_heads()
         << ", causal=" << yes_no(options.causal()) << ", bias=" << yes_no(options.bias())
         << ", dropout=" << options.dropout() << ")";
}

// ----------------------------------------------------------------------------- DropPath

DropPathImpl::DropPathImpl(double probability_) : probability(probability_) { reset(); }

void DropPathImpl::reset() { check_dropout(probability, "DropPath", "probability"); }

at::Tensor DropPathImpl::forward(const at::Tensor& input) {
  if (!is_training() || probability == 0.0) return input;
  const double keep = 1.0 - probability;
  std::vector<int64_t> shape(input.dim(), 1);
  shape[0] = input.size(0);
  return input * at::empty(shape, input.options()).bernoulli_(keep).div_(keep);
}

void DropPathImpl::pretty_print(std::ostream& stream) const {
  stream << "convnn::models::DropPath(p=" << probability << ")";
}

// ----------------------------------------------------------------------------- TransformerBlock

TransformerBlockImpl::TransformerBlockImpl(TransformerBlockOptions options_) : options(std::move(options_)) {
  reset();
}

void TransformerBlockImpl::reset() {
  const auto& o = options;
  const int64_t dim = o.embed_dim();
  const int64_t mlp_dim = o.mlp_dim() > 0 ? o.mlp_dim() : 4 * dim;
  check_dropout(o.dropout(), "TransformerBlock", "dropout");
  check_dropout(o.attention_dropout(), "TransformerBlock", "attention_dropout");
  norm1 = register_module("norm1", layer_norm(dim));
  if (o.attention() == ViTAttention::MHSA) {
    attn = torch::nn::AnyModule(SelfAttention(SelfAttentionOptions(dim, o.num_heads())
                                                  .bias(o.attention_bias())
                                                  .dropout(o.attention_dropout())
                                                  .num_kv_heads(o.num_kv_heads())
                                                  .causal(o.causal())));
  } else {
    auto a = o.convnn();
    a.embed_dim(dim)
        .num_heads(o.num_heads())
        .qkv_bias(o.attention_bias())
        .out_bias(o.attention_bias())
        .dropout(o.attention_dropout())
        .num_kv_heads(o.num_kv_heads())
        .causal(o.causal());
    // KVT is ConvNN attention whose aggregation is a plain sum: the kernel is fixed to ones.
    if (o.attention() == ViTAttention::KVT) a.learnable_kernel(false);
    attn = torch::nn::AnyModule(nn::ConvNNAttention(a));
  }
  register_module("attn", attn.ptr());
  norm2 = register_module("norm2", layer_norm(dim));
  fc1 = register_module("fc1", torch::nn::Linear(dim, mlp_dim));
  fc2 = register_module("fc2", torch::nn::Linear(mlp_dim, dim));
  dropout = register_module("dropout", torch::nn::Dropout(o.dropout()));
  drop_path = register_module("drop_path", DropPath(o.drop_path()));
}

at::Tensor TransformerBlockImpl::forward(const at::Tensor& input) {
  const auto x = input + drop_path(dropout(attn.forward(norm1(input))));
  return x + drop_path(dropout(fc2(dropout(torch::gelu(fc1(norm2(x)))))));
}

nn::KVCache TransformerBlockImpl::make_cache(int64_t batch, int64_t max_length) const {
  if (const auto* mhsa = attn.ptr()->as<SelfAttentionImpl>()) return mhsa->make_cache(batch, max_length);
  return attn.ptr()->as<nn::ConvNNAttentionImpl>()->make_cache(batch, max_length);
}

at::Tensor TransformerBlockImpl::forward_step(const at::Tensor& input, nn::KVCache& cache,
                                              const std::vector<int64_t>& counts) {
  TORCH_CHECK(options.causal(), "TransformerBlock.forward_step: decoding needs a causal block (causal = true)");
  const auto normed = norm1(input);
  auto* mhsa = attn.ptr()->as<SelfAttentionImpl>();
  const auto attended = mhsa != nullptr ? mhsa->forward_step(normed, cache, counts)
                                        : attn.ptr()->as<nn::ConvNNAttentionImpl>()->forward_step(normed, cache, counts);
  const auto x = input + drop_path(dropout(attended));
  return x + drop_path(dropout(fc2(dropout(torch::gelu(fc1(norm2(x)))))));
}

void TransformerBlockImpl::add_cost(CostReport& report, const std::string& stage, int64_t tokens) const {
  const int64_t n = tokens, dim = options.embed_dim(), elements = n * dim;
  const int64_t mlp_dim = fc1->options.out_features();
  report.add(stage, stage + ".norm1", "layernorm", layer_norm_cost(elements));
  const auto attention = stage + ".attn";
  if (options.attention() == ViTAttention::MHSA) {
    const bool bias = options.attention_bias();
    const int64_t scores = options.num_heads() * n * n;
    const int64_t qkv_features = attn.ptr<SelfAttentionImpl>()->qkv->options.out_features();
    report.add(stage, attention + ".qkv", "linear", linear_cost(n, dim, qkv_features, bias));
    report.add(stage, attention, "scores", {n * n * dim, scores, 0});  // QK^T, then the scale
    report.add(stage, attention, "softmax", softmax_cost(scores));
    report.add(stage, attention, "weighted_sum", {n * n * dim, 0, 0});  // AV
    report.add(stage, attention + ".proj", "linear", linear_cost(n, dim, dim, bias));
  } else {
    add_convnn_attention(report, stage, attention, attn.ptr<nn::ConvNNAttentionImpl>()->options, n);
  }
  report.add(stage, stage, "add", addition_cost(elements));
  report.add(stage, stage + ".norm2", "layernorm", layer_norm_cost(elements));
  report.add(stage, stage + ".fc1", "linear", linear_cost(n, dim, mlp_dim, true));
  report.add(stage, stage + ".gelu", "gelu", gelu_cost(n * mlp_dim));
  report.add(stage, stage + ".fc2", "linear", linear_cost(n, mlp_dim, dim, true));
  report.add(stage, stage, "add", addition_cost(elements));
}

void TransformerBlockImpl::pretty_print(std::ostream& stream) const {
  stream << "convnn::models::TransformerBlock(embed_dim=" << options.embed_dim()
         << ", num_heads=" << options.num_heads() << ", attention=" << to_string(options.attention())
         << ", drop_path=" << options.drop_path() << ")";
}

// ----------------------------------------------------------------------------- VisionTransformer

int64_t VisionTransformerOptions::tokens() const {
  const int64_t side = image_size_ / patch_size_;
  return side * side + 1;
}

VisionTransformerImpl::VisionTransformerImpl(VisionTransformerOptions options_)
    : options(std::move(options_)) {
  reset();
}

void VisionTransformerImpl::reset() {
  const auto& o = options;
  constexpr const char* name = "VisionTransformer";
  TORCH_CHECK(o.embed_dim() >= 1 && o.depth() >= 1, name, ": embed_dim and depth must be at least 1, got ",
              o.embed_dim(), " and ", o.depth());
  TORCH_CHECK(o.num_heads() >= 1 && o.embed_dim() % o.num_heads() == 0, name, ": num_heads = ", o.num_heads(),
              " must be at least 1 and divide embed_dim = ", o.embed_dim());
  TORCH_CHECK(o.patch_size() >= 1 && o.image_size() >= o.patch_size() && o.image_size() % o.patch_size() == 0,
              name, ": image_size = ", o.image_size(),
              " must be a positive multiple of patch_size = ", o.patch_size());
  TORCH_CHECK(o.in_channels() >= 1, name, ": in_channels must be at least 1, got ", o.in_channels());
  TORCH_CHECK(o.num_classes() >= 1, name, ": num_classes must be at least 1, got ", o.num_classes());
  TORCH_CHECK(o.mlp_dim() >= 0, name, ": mlp_dim must be non-negative (0 = 4 * embed_dim), got ",
              o.mlp_dim());
  check_dropout(o.dropout(), name, "dropout");
  check_dropout(o.drop_path(), name, "drop_path");
  const int64_t dim = o.embed_dim(), tokens = o.tokens();
  if (o.attention() != ViTAttention::MHSA) {
    const int64_t k = o.convnn().k(), r = o.convnn().num_candidates();
    TORCH_CHECK(k >= 1 && k <= tokens, name, ": k = ", k, " must be in [1, N] where N = ", tokens,
                " tokens (", tokens - 1, " patches of ", o.image_size(), " px images with patch_size ",
                o.patch_size(), ", plus the class token), for attention = ", to_string(o.attention()));
    TORCH_CHECK(r == 0 || (r <= tokens && k <= r), name, ": num_candidates = ", r,
                " must be 0 (all) or in [k, N] = [", k, ", ", tokens, "]");
  }

  patch_embed = register_module(
      "patch_embed",
      torch::nn::Conv2d(
          torch::nn::Conv2dOptions(o.in_channels(), dim, o.patch_size()).stride(o.patch_size())));
  patch_norm = o.patch_norm() ? register_module("patch_norm", layer_norm(dim)) : nullptr;
  cls_token = register_parameter("cls_token", at::zeros({1, 1, dim}));
  if (o.position_embedding() == PositionEmbedding::Learned) {
    pos_embed = register_parameter("pos_embed", at::zeros({1, tokens, dim}));
  } else {
    pos_embed = register_buffer("pos_embed", sinusoidal_position_encoding(tokens, dim).unsqueeze(0));
  }
  pos_drop = register_module("pos_drop", torch::nn::Dropout(o.dropout()));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.depth(); ++i) blocks->push_back(TransformerBlock(transformer_block_options(o, i)));
  norm = o.final_norm() ? register_module("norm", layer_norm(dim)) : nullptr;
  head = register_module("head", torch::nn::Linear(dim, o.num_classes()));

  // timm's initialisation: every Linear N(0, 0.02) with zero bias, class token and learned positions
  // N(0, 0.02). LayerNorm starts as the identity; the patch embedding keeps Conv2d's default.
  normal_init_linear_layers(*this);
  torch::NoGradGuard no_grad;
  cls_token.normal_(0.0, 0.02);
  if (o.position_embedding() == PositionEmbedding::Learned) pos_embed.normal_(0.0, 0.02);
}

at::Tensor VisionTransformerImpl::forward(const at::Tensor& input) {
  const auto& o = options;
  TORCH_CHECK(input.defined() && input.dim() == 4 && input.size(1) == o.in_channels() &&
                  input.size(2) == o.image_size() && input.size(3) == o.image_size(),
              "VisionTransformer: input must be [B, ", o.in_channels(), ", ", o.image_size(), ", ",
              o.image_size(), "] (the position embedding fixes the image size), got ",
              input.defined() ? input.sizes() : c10::IntArrayRef{});
  auto x = patch_embed(input).flatten(2).transpose(1, 2);  // [B, patches, D]
  if (patch_norm) x = patch_norm(x);
  x = pos_drop(at::cat({cls_token.expand({x.size(0), -1, -1}), x}, 1) + pos_embed);
  for (size_t i = 0; i < blocks->size(); ++i) x = blocks->at<TransformerBlockImpl>(i).forward(x);
  // LayerNorm acts per token, so normalising the class token alone gives timm's result.
  auto cls = x.select(1, 0);
  if (norm) cls = norm(cls);
  return head(cls);
}

CostReport VisionTransformerImpl::cost(int64_t height, int64_t width) const {
  const auto& o = options;
  TORCH_CHECK(height == o.image_size() && width == o.image_size(), "VisionTransformer: cost is for ",
              o.image_size(), "x", o.image_size(), " images (the position embedding fixes the size), got ",
              height, "x", width);
  const int64_t side = o.image_size() / o.patch_size(), patches = side * side, tokens = patches + 1;
  const int64_t dim = o.embed_dim();
  CostReport report;
  report.add("embed", "patch_embed", "conv2d", conv2d_cost(patch_embed->options, side, side));
  if (patch_norm) report.add("embed", "patch_norm", "layernorm", layer_norm_cost(patches * dim));
  report.add("embed", "pos_embed", "add", addition_cost(tokens * dim));
  for (size_t i = 0; i < blocks->size(); ++i) {
    blocks->at<TransformerBlockImpl>(i).add_cost(report, "blocks." + std::to_string(i), tokens);
  }
  if (norm) report.add("head", "norm", "layernorm", layer_norm_cost(dim));
  report.add("head", "head", "linear", linear_cost(1, dim, o.num_classes(), true));
  report.count_parameters(*this, transformer_stage);
  return report;
}

void VisionTransformerImpl::pretty_print(std::ostream& stream) const {
  const auto& o = options;
  stream << "convnn::models::VisionTransformer(embed_dim=" << o.embed_dim() << ", depth=" << o.depth()
         << ", num_heads=" << o.num_heads() << ", image_size=" << o.image_size()
         << ", patch_size=" << o.patch_size() << ", attention=" << to_string(o.attention());
  if (o.attention() != ViTAttention::MHSA) stream << ", k=" << o.convnn().k();
  stream << ", position_embedding=" << to_string(o.position_embedding())
         << ", patch_norm=" << yes_no(o.patch_norm()) << ", final_norm=" << yes_no(o.final_norm())
         << ", attention_bias=" << yes_no(o.attention_bias()) << ")";
}

}  // namespace convnn::models
