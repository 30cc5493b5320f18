// The model registry as dispatcher ops, for the Python package (python/convnn/models.py):
//
//   convnn::model_names()                 the registry's names
//   convnn::model_table()                 the registry's rows (name, family, preset), as JSON
//   convnn::model_family_table()          the family rows (names, ConvNN layers, timm's listing), as JSON
//   convnn::model_config_defaults()       ModelConfig's defaults, as JSON
//   convnn::model_build(name, config)     the C++ model built once: each module's path, kind and
//                                         constructor arguments (in registration order), and its
//                                         parameters and buffers, as initialised by C++
//   convnn::self_attention_step(...)     SelfAttention's decoding step on a cache's tensors: appends
//                                         the keys and values (the cache's rule), then attend_to_cache
//   convnn::sample_tokens(logits, ...)    a language model's next tokens (models::sample_tokens), the
//                                         one sampling rule of `convnn generate` and Python's generate
//   convnn::generation_restart_tokens(n)  what generate reads again when its caches are full
//   convnn::language_model_check_tokens(...)  the rule for a language model's tokens (check_tokens)
//
// Python rebuilds the same tree from the structure (its convnn.nn layers from the option texts,
// torch.nn layers from the arguments) and loads these tensors, so names, shapes, initialisation and
// every architectural choice (slots, strides, widths, the paper variants) are the C++ registry's.
#include <torch/library.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include <nlohmann/json.hpp>

#include "util/json_fields.h"
#include <string>
#include <tuple>
#include <vector>

#include "convnn/models/registry.h"
#include "convnn/nn/modules/convnn.h"
#include "nn/layer_ops.h"
#include "nn/modules/sequence_forward.h"

namespace convnn::models {
namespace {

using Texts = std::vector<std::string>;
using nlohmann::json;

json conv2d_arguments(const torch::nn::Conv2dImpl& conv) {
  const auto& o = conv.options;
  const auto* padding = std::get_if<torch::ExpandingArray<2>>(&o.padding());
  TORCH_CHECK(padding != nullptr, "model_build: a Conv2d with explicit padding");
  return {{"in_channels", o.in_channels()}, {"out_channels", o.out_channels()},
          {"kernel_size", o.kernel_size()->at(0)}, {"stride", o.stride()->at(0)},
          {"padding", (*padding)->at(0)}, {"bias", o.bias()}};
}

// (kind, constructor arguments as a JSON object) of one module. The convnn layers are leaves,
// built by Python's own layer classes from their option texts ("options").
std::pair<std::string, json> describe(const torch::nn::Module& module) {
  if (const auto* m = dynamic_cast<const nn::ConvNN2dImpl*>(&module)) {
    return {"ConvNN2d", {{"options", nn::detail::option_texts(m->options)}}};
  }
  if (const auto* m = dynamic_cast<const nn::ConvNNAttentionImpl*>(&module)) {
    return {"ConvNNAttention", {{"options", nn::detail::option_texts(m->options)}}};
  }
  if (const auto* m = dynamic_cast<const nn::BranchingConv2dImpl*>(&module)) {
    return {"BranchingConv2d", {{"options", nn::detail::option_texts(m->options)}}};
  }
  if (const auto* m = dynamic_cast<const torch::nn::Conv2dImpl*>(&module)) return {"Conv2d", conv2d_arguments(*m)};
  if (const auto* m = dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module)) {
    const auto& o = m->options;
    return {"BatchNorm2d", {{"num_features", o.num_features()}, {"eps", o.eps()},
                            {"momentum", o.momentum().value_or(0.1)}, {"affine", o.affine()},
                            {"track_running_stats", o.track_running_stats()}}};
  }
  if (const auto* m = dynamic_cast<const torch::nn::MaxPool2dImpl*>(&module)) {
    const auto& o = m->options;
    return {"MaxPool2d", {{"kernel_size", o.kernel_size()->at(0)}, {"stride", o.stride()->at(0)},
                          {"padding", o.padding()->at(0)}}};
  }
  if (const auto* m = dynamic_cast<const torch::nn::LinearImpl*>(&module)) {
    const auto& o = m->options;
    return {"Linear", {{"in_features", o.in_features()}, {"out_features", o.out_features()}, {"bias", o.bias()}}};
  }
  if (const auto* m = dynamic_cast<const torch::nn::LayerNormImpl*>(&module)) {
    const auto& o = m->options;
    return {"LayerNorm", {{"normalized_shape", o.normalized_shape()}, {"eps", o.eps()},
                          {"elementwise_affine", o.elementwise_affine()}}};
  }
  if (const auto* m = dynamic_cast<const torch::nn::DropoutImpl*>(&module)) return {"Dropout", {{"p", m->options.p()}}};
  if (const auto* m = dynamic_cast<const DropPathImpl*>(&module)) return {"DropPath", {{"p", m->probability}}};
  if (const auto* m = dynamic_cast<const SelfAttentionImpl*>(&module)) {
    return {"SelfAttention", {{"num_heads", m->options.num_heads()}, {"dropout", m->options.dropout()},
                              {"num_kv_heads", m->options.kv_heads()}, {"causal", m->options.causal()}}};
  }
  if (const auto* m = dynamic_cast<const torch::nn::EmbeddingImpl*>(&module)) {
    const auto& o = m->options;
    return {"Embedding", {{"num_embeddings", o.num_embeddings()}, {"embedding_dim", o.embedding_dim()}}};
  }
  if (const auto* m = dynamic_cast<const LanguageModelImpl*>(&module)) {
    return {"LanguageModel", {{"context", m->options.context()}, {"vocab_size", m->options.vocab_size()}}};
  }
  if (dynamic_cast<const TransformerBlockImpl*>(&module)) return {"TransformerBlock", json::object()};
  if (const auto* m = dynamic_cast<const VisionTransformerImpl*>(&module)) {
    return {"VisionTransformer", {{"image_size", m->options.image_size()}, {"in_channels", m->options.in_channels()}}};
  }
  if (dynamic_cast<const torch::nn::ModuleListImpl*>(&module)) return {"ModuleList", json::object()};
  if (dynamic_cast<const torch::nn::SequentialImpl*>(&module)) return {"Sequential", json::object()};
  if (dynamic_cast<const ResidualBlockImpl*>(&module)) return {"ResidualBlock", json::object()};
  if (dynamic_cast<const ResNetImpl*>(&module)) return {"ResNet", json::object()};
  TORCH_CHECK(false, "model_build: the Python package has no counterpart for ", module.name());
}

bool is_layer(const std::string& kind) {
  return kind == "ConvNN2d" || kind == "BranchingConv2d" || kind == "ConvNNAttention";
}

std::tuple<Texts, Texts, Texts, Texts, std::vector<at::Tensor>, c10::List<bool>> model_build(
    c10::string_view name_view, c10::string_view config_json) {
  const std::string name(name_view);
  ModelConfig config;
  try {
    config = convnn::detail::parse_json(std::string(config_json), "create_model: the options").get<ModelConfig>();
  } catch (const json::exception& e) {
    TORCH_CHECK(false, "create_model: ", e.what());
  }
  const Model model = build_model(name, config);
  Texts paths, kinds, names, arguments;
  std::vector<std::string> layer_prefixes;
  for (const auto& item : model.module()->named_modules()) {
    const auto& path = item.key();
    bool inside_layer = false;
    for (const auto& prefix : layer_prefixes) inside_layer |= path.rfind(prefix, 0) == 0;
    if (inside_layer) continue;
    auto [kind, args] = describe(*item.value());
    if (is_layer(kind)) layer_prefixes.push_back(path + ".");
    paths.push_back(path);
    kinds.push_back(kind);
    arguments.push_back(args.dump());
  }
  std::vector<at::Tensor> tensors;
  c10::List<bool> trainable;
  for (const auto& item : model.module()->named_parameters(/*recurse=*/true)) {
    names.push_back(item.key());
    tensors.push_back(item.value().detach());
    trainable.push_back(true);
  }
  for (const auto& item : model.module()->named_buffers(/*recurse=*/true)) {
    names.push_back(item.key());
    tensors.push_back(item.value());
    trainable.push_back(false);
  }
  return {paths, kinds, arguments, names, tensors, trainable};
}

// Python's convnn.nn.KVCache holds the tensors and the lengths: returns the output [B,H,t,d] and the
// lengths after the step.
std::tuple<at::Tensor, std::vector<int64_t>> self_attention_step(
    const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values, const at::Tensor& cache_keys,
    const at::Tensor& cache_values, std::vector<int64_t> lengths, std::vector<int64_t> counts) {
  const auto before = lengths;
  nn::detail::append_to_cache(cache_keys, cache_values, lengths, flat_heads(keys), flat_heads(values), std::move(counts));
  return {attend_to_cache(queries, cache_keys, cache_values, before), lengths};
}

std::string model_config_defaults() { return json(ModelConfig{}).dump(); }

std::string model_table() { return json(model_entries()).dump(); }

std::string model_family_table() { return json(model_families()).dump(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(convnn, m) {
  m.def("model_names() -> str[]", [] { return model_names(); });
  m.def("model_table() -> str", &model_table);
  m.def("model_family_table() -> str", &model_family_table);
  m.def("model_config_defaults() -> str", &model_config_defaults);
  m.def("self_attention_step(Tensor queries, Tensor keys, Tensor values, Tensor(a!) cache_keys, "
        "Tensor(b!) cache_values, int[] lengths, int[] counts) -> (Tensor output, int[] lengths)");
  m.def("generation_restart_tokens(int context) -> int", &generation_restart_tokens);
  m.def("language_model_check_tokens(Tensor tokens, int vocab_size, int context, int first_position, str argument) "
        "-> ()",
        [](const at::Tensor& tokens, int64_t vocab_size, int64_t context, int64_t first_position,
           const std::string& argument) { check_tokens(tokens, vocab_size, context, first_position, argument); });
  m.def("sample_tokens(Tensor logits, float temperature, int top_k, Generator? generator=None) -> Tensor",
        [](const at::Tensor& logits, double temperature, int64_t top_k, std::optional<at::Generator> generator) {
          return sample_tokens(logits, SamplingOptions{temperature, top_k}, std::move(generator));
        });
  m.def("model_build(str name, str config) -> (str[] paths, str[] kinds, str[] arguments, str[] names, "
        "Tensor[] tensors, bool[] trainable)",
        &model_build);
}

TORCH_LIBRARY_IMPL(convnn, CompositeImplicitAutograd, m) { m.impl("self_attention_step", &self_attention_step); }

}  // namespace convnn::models
