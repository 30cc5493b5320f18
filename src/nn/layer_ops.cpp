// The layers and functional forms as dispatcher ops, which the Python package (python/convnn/nn)
// calls: Python owns the parameters and the module tree, C++ owns every rule. Options travel as
// "name=value" strings, read and written through the one field list of src/nn/option_fields.h, so
// the option names, types and defaults Python shows are the C++ structs' own.
//
//   convnn::layer_option_fields(layer)          names, types, defaults, number of required ones
//   convnn::layer_parameters(layer, options)    the C++ module's parameters and buffers, as built
//                                               and initialised by its reset()
//   convnn::layer_submodules(layer, options)    its torch::nn::Linear and ConvNd sub-layers and
//                                               their geometry, which Python builds as nn modules
//   convnn::layer_forward(layer, options, ...)  the C++ module's forward on the given tensors
//   convnn::attention_aggregate(options, q, k, v, ...)  ConvNNAttention's forward between its
//                                               projections; attention_check_input its input rule;
//                                               attention_aggregate_packed on packed sequences,
//                                               attention_step a decoding step with a cache
//                                               (attention_static_step on a static one),
//                                               attention_cache_geometry the cache's per-sample shape
//   convnn::conv_nn / conv_nn1d / 2d / 3d       the functional forms
//   convnn::layer_forward_with_neighbours, attention_aggregate_with_neighbours: the forwards and
//                                               what they selected (convnn/nn/neighbours.h, as a
//                                               tuple of its fields); neighbours_on_token_grid and
//                                               neighbour_view its functions
//
// layer is ConvNN1d, ConvNN2d, ConvNN3d, ConvNNAttention, BranchingConv2d or BranchingConv3d. The forward ops are
// CompositeImplicitAutograd: autograd, torch.compile and torch.export see the core ops inside.
#include <ATen/ATen.h>
#include <torch/library.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <variant>
#include <vector>

#include "convnn/nn/functional/convnn.h"
#include "convnn/nn/modules/convnn.h"
#include "convnn/nn/neighbours.h"
#include "nn/layer_ops.h"
#include "nn/modules/layer_forward.h"
#include "nn/modules/sequence_forward.h"
#include "nn/option_fields.h"

namespace convnn::nn {
namespace {

using detail::FieldText;
using OptionTexts = std::vector<std::string>;

// Options built from "name=value" texts over `options` (which holds the defaults). Every name must
// be a field; the first `required` fields must be given.
template <typename Options>
void apply_option_texts(Options& options, const OptionTexts& texts, int64_t required, const std::string& where) {
  std::unordered_map<std::string, std::string> given;
  for (const auto& text : texts) {
    const auto eq = text.find('=');
    TORCH_CHECK(eq != std::string::npos && eq > 0, where, ": options must be name=value, got '", text, "'");
    TORCH_CHECK(given.emplace(text.substr(0, eq), text.substr(eq + 1)).second, where, ": option ",
                text.substr(0, eq), " is given twice");
  }
  std::set<std::string> fields;
  std::string known;
  detail::visit_option_fields(options, [&](const char* name, auto&) {
    fields.insert(name);
    known += (known.empty() ? "" : ", ") + std::string(name);
  });
  for (const auto& [alias, option] : detail::kOptionAliases) {
    const auto it = given.find(alias);
    if (it == given.end() || fields.count(alias) || !fields.count(option)) continue;
    TORCH_CHECK(!given.count(option), where, ": ", alias, " and ", option, " are the same option; give one");
    given.emplace(option, it->second);
    given.erase(it);
  }
  int64_t index = 0;
  detail::visit_option_fields(options, [&](const char* name, auto& field) {
    const auto it = given.find(name);
    if (it == given.end()) {
      TORCH_CHECK(index >= required, where, ": the required option ", name, " is missing");
    } else {
      FieldText::parse(name, it->second, field);
      given.erase(it);
    }
    ++index;
  });
  TORCH_CHECK(given.empty(), where, ": unknown option ", given.begin()->first, "; the options are ", known);
}

// The layers: their options with stand-in values for the required fields, which every call
// gives, and how many leading fields are required (the C++ constructor's arguments).
struct ConvNN1dLayer {
  using Options = ConvNN1dOptions;
  using Module = ConvNN1d;
  static Options defaults() { return Options(1, 1, 1); }
  static constexpr int64_t kRequired = 3;
};
struct ConvNN2dLayer {
  using Options = ConvNN2dOptions;
  using Module = ConvNN2d;
  static Options defaults() { return Options(1, 1, 1); }
  static constexpr int64_t kRequired = 3;
};
struct ConvNN3dLayer {
  using Options = ConvNN3dOptions;
  using Module = ConvNN3d;
  static Options defaults() { return Options(1, 1, 1); }
  static constexpr int64_t kRequired = 3;
};
struct AttentionLayer {
  using Options = ConvNNAttentionOptions;
  using Module = ConvNNAttention;
  static Options defaults() { return Options(1, 1, 1); }
  static constexpr int64_t kRequired = 3;
};
template <size_t D>
struct BranchingLayer {
  using Options = BranchingConvOptions<D>;
  using Module = std::conditional_t<D == 2, BranchingConv2d, BranchingConv3d>;
  static Options defaults() { return Options(1, 1); }
  static constexpr int64_t kRequired = 2;
};
template <typename Layer>
constexpr bool kIsBranching = std::is_same_v<Layer, BranchingLayer<2>> || std::is_same_v<Layer, BranchingLayer<3>>;

template <typename Fn>
auto with_layer(const std::string& layer, Fn&& fn) {
  if (layer == "ConvNN1d") return fn(ConvNN1dLayer{});
  if (layer == "ConvNN2d") return fn(ConvNN2dLayer{});
  if (layer == "ConvNN3d") return fn(ConvNN3dLayer{});
  if (layer == "ConvNNAttention") return fn(AttentionLayer{});
  if (layer == "BranchingConv3d") return fn(BranchingLayer<3>{});
  TORCH_CHECK(layer == "BranchingConv2d", "layer must be one of ConvNN1d, ConvNN2d, ConvNN3d, ConvNNAttention, ",
              "BranchingConv2d, BranchingConv3d; got '", layer, "'");
  return fn(BranchingLayer<2>{});
}

template <typename Layer>
typename Layer::Options layer_options(Layer, const OptionTexts& texts, const std::string& layer) {
  auto options = Layer::defaults();
  apply_option_texts(options, texts, Layer::kRequired, layer);
  return options;
}

std::tuple<std::vector<std::string>, std::vector<std::string>, std::vector<std::string>, int64_t>
layer_option_fields(const std::string& layer) {
  return with_layer(layer, [](auto kind) {
    using Layer = decltype(kind);
    std::vector<std::string> names, types, defaults;
    auto options = Layer::defaults();
    detail::visit_option_fields(options, [&](const char* name, auto& field) {
      names.emplace_back(name);
      types.emplace_back(FieldText::type(field));
      defaults.push_back(FieldText::format(field));
    });
    return std::make_tuple(names, types, defaults, Layer::kRequired);
  });
}

// bool[] returns as a c10::List: the dispatcher takes no std::vector<bool>.
std::tuple<std::vector<std::string>, std::vector<at::Tensor>, c10::List<bool>> layer_parameters(
    const std::string& layer, const OptionTexts& texts) {
  return with_layer(layer, [&](auto kind) {
    using Layer = decltype(kind);
    const typename Layer::Module module(layer_options(kind, texts, layer));
    std::vector<std::string> names;
    std::vector<at::Tensor> tensors;
    c10::List<bool> trainable;
    for (const auto& item : module->named_parameters(/*recurse=*/true)) {
      names.push_back(item.key());
      tensors.push_back(item.value().detach());
      trainable.push_back(true);
    }
    for (const auto& item : module->named_buffers(/*recurse=*/true)) {
      names.push_back(item.key());
      tensors.push_back(item.value());
      trainable.push_back(false);
    }
    return std::make_tuple(names, tensors, trainable);
  });
}

// One ConvNd sub-layer's kind and geometry (stride, padding, dilation: D each), or false.
template <size_t D, typename Conv>
bool describe_conv(const torch::nn::Module& module, const char* kind, std::string& kind_out,
                   std::vector<int64_t>& geometry) {
  const auto* conv = dynamic_cast<const Conv*>(&module);
  if (conv == nullptr) return false;
  const auto& o = conv->options;
  const auto* padding = std::get_if<torch::ExpandingArray<D>>(&o.padding());
  // The layers build their convolutions with explicit zero padding, one group (nn/modules/convnn.cpp).
  TORCH_INTERNAL_ASSERT(padding != nullptr && o.groups() == 1 && std::holds_alternative<torch::enumtype::kZeros>(
                                                                          o.padding_mode()),
                        "layer_submodules: a convolution of another form than the layers build");
  kind_out = kind;
  for (const auto* values : {&o.stride(), padding, &o.dilation()}) {
    for (size_t axis = 0; axis < D; ++axis) geometry.push_back((**values)[axis]);
  }
  return true;
}

// The layer's sub-layers of LibTorch's Linear and ConvNd kinds, by state_dict prefix: their kinds
// ("linear", "conv1d", "conv2d", "conv3d") and, for each convolution in order, its stride, padding
// and dilation (D each), so that Python's nn modules compute what the C++ ones do.
std::tuple<std::vector<std::string>, std::vector<std::string>, std::vector<int64_t>> layer_submodules(
    const std::string& layer, const OptionTexts& texts) {
  return with_layer(layer, [&](auto kind) {
    using Layer = decltype(kind);
    const typename Layer::Module module(layer_options(kind, texts, layer));
    std::vector<std::string> names, kinds;
    std::vector<int64_t> geometry;
    for (const auto& item : module->named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
      const auto& sub = *item.value();
      std::string sub_kind;
      if (dynamic_cast<const torch::nn::LinearImpl*>(&sub) != nullptr) {
        sub_kind = "linear";
      } else if (!describe_conv<1, torch::nn::Conv1dImpl>(sub, "conv1d", sub_kind, geometry) &&
                 !describe_conv<2, torch::nn::Conv2dImpl>(sub, "conv2d", sub_kind, geometry)) {
        describe_conv<3, torch::nn::Conv3dImpl>(sub, "conv3d", sub_kind, geometry);
      }
      if (sub_kind.empty()) continue;
      names.push_back(item.key());
      kinds.push_back(sub_kind);
    }
    return std::make_tuple(names, kinds, geometry);
  });
}

// The tensors by state_dict name; an absent name gives an undefined tensor.
class NamedTensors {
 public:
  NamedTensors(const std::vector<std::string>& names, const std::vector<at::Tensor>& tensors) {
    TORCH_CHECK(names.size() == tensors.size(), "layer_forward: ", names.size(), " names for ", tensors.size(),
                " tensors");
    for (size_t i = 0; i < names.size(); ++i) by_name_.emplace(names[i], tensors[i]);
  }
  at::Tensor operator()(const std::string& name) const {
    const auto it = by_name_.find(name);
    return it == by_name_.end() ? at::Tensor() : it->second;
  }
  detail::LinearTensors linear(const std::string& prefix) const {
    return {(*this)(prefix + ".weight"), (*this)(prefix + ".bias")};
  }
  detail::ConvNNTensors convnn(const std::string& prefix) const {
    return {(*this)(prefix + "kernel"), (*this)(prefix + "bias"), linear(prefix + "query_projection"),
            linear(prefix + "key_projection"), linear(prefix + "value_projection")};
  }

 private:
  std::unordered_map<std::string, at::Tensor> by_name_;
};

// ConvNNAttention's tensors by their state_dict names, with the call's masks.
detail::AttentionTensors attention_tensors(const NamedTensors& named, const c10::optional<at::Tensor>& attn_mask,
                                           const c10::optional<at::Tensor>& key_padding_mask = c10::nullopt) {
  return {named("kernel"),
          named("bias"),
          named.linear("query_projection"),
          named.linear("key_projection"),
          named.linear("value_projection"),
          named.linear("output_projection"),
          {at::Tensor(), attn_mask.value_or(at::Tensor()), key_padding_mask.value_or(at::Tensor())}};
}

// Neighbours as the ops return them: its fields in order (an attention layer's grid fields empty).
using NeighbourFields = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, std::vector<int64_t>,
                                   std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, int64_t, int64_t, bool>;
constexpr const char* kNeighbourFields =
    "Tensor indices, Tensor scores, Tensor weights, Tensor positions, Tensor query_positions, int[] input_sizes, "
    "int[] query_grid, int[] stride, int[] dilation, int padding, int k, bool has_window";

NeighbourFields neighbour_fields(const Neighbours& n) {
  return {n.indices, n.scores, n.weights, n.positions, n.query_positions, n.input_sizes, n.query_grid,
          n.stride, n.dilation, n.padding, n.k, n.has_window};
}

// The forward's output followed by the neighbour fields.
template <typename... Fields>
auto with_output(const at::Tensor& output, const std::tuple<Fields...>& fields) {
  return std::tuple_cat(std::make_tuple(output), fields);
}

ConvNNAttentionOptions attention_options(const OptionTexts& texts) {
  return layer_options(AttentionLayer{}, texts, "ConvNNAttention");
}

at::Tensor attention_aggregate_op(const OptionTexts& texts, const at::Tensor& queries, const at::Tensor& keys,
                                  const at::Tensor& values, const std::vector<std::string>& names,
                                  const std::vector<at::Tensor>& tensors, bool training,
                                  c10::optional<at::Generator> generator, const c10::optional<at::Tensor>& mask,
                                  const c10::optional<at::Tensor>& key_padding_mask) {
  const auto options = attention_options(texts);
  const auto draw = CandidateDraw::with_generator(generator, options.eval_candidates(), options.eval_seed());
  return detail::attention_aggregate(options, queries, keys, values,
                                     attention_tensors(NamedTensors(names, tensors), mask, key_padding_mask),
                                     draw.generator(training), training);
}

at::Tensor attention_aggregate_packed_op(const OptionTexts& texts, const at::Tensor& queries, const at::Tensor& keys,
                                         const at::Tensor& values, const std::vector<std::string>& names,
                                         const std::vector<at::Tensor>& tensors, bool training,
                                         const at::Tensor& cu_seqlens) {
  return detail::attention_aggregate_packed(attention_options(texts), queries, keys, values,
                                            attention_tensors(NamedTensors(names, tensors), c10::nullopt, c10::nullopt),
                                            cu_seqlens, training);
}

// One decoding step on the cache's tensors (Python's convnn.nn.KVCache holds them): appends the new
// keys and values, then aggregates; returns the output and the lengths after the step.
std::tuple<at::Tensor, std::vector<int64_t>> attention_step_op(
    const OptionTexts& texts, const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
    const std::vector<std::string>& names, const std::vector<at::Tensor>& tensors, bool training,
    const at::Tensor& cache_keys, const at::Tensor& cache_values, std::vector<int64_t> lengths,
    std::vector<int64_t> counts) {
  const auto options = attention_options(texts);
  const auto before = lengths;
  const auto written = detail::append_to_cache(cache_keys, cache_values, lengths, keys, values, std::move(counts));
  auto output = detail::attention_aggregate_step(
      options, queries, attention_tensors(NamedTensors(names, tensors), c10::nullopt, c10::nullopt), cache_keys,
      cache_values, before, written, training);
  return {output, lengths};
}

at::Tensor attention_static_step_op(const OptionTexts& texts, const at::Tensor& queries, const at::Tensor& keys,
                                    const at::Tensor& values, const std::vector<std::string>& names,
                                    const std::vector<at::Tensor>& tensors, bool training, const at::Tensor& cache_keys,
                                    const at::Tensor& cache_values, const at::Tensor& lengths) {
  return detail::attention_aggregate_static_step(
      attention_options(texts), queries, keys, values,
      attention_tensors(NamedTensors(names, tensors), c10::nullopt, c10::nullopt), cache_keys, cache_values, lengths,
      training);
}

auto attention_aggregate_with_neighbours(const OptionTexts& texts, const at::Tensor& queries, const at::Tensor& keys,
                                         const at::Tensor& values, const std::vector<std::string>& names,
                                         const std::vector<at::Tensor>& tensors, bool training,
                                         c10::optional<at::Generator> generator, const c10::optional<at::Tensor>& mask,
                                         const c10::optional<at::Tensor>& key_padding_mask) {
  const auto options = attention_options(texts);
  const auto draw = CandidateDraw::with_generator(generator, options.eval_candidates(), options.eval_seed());
  Neighbours neighbours;
  const auto output = detail::attention_aggregate(
      options, queries, keys, values, attention_tensors(NamedTensors(names, tensors), mask, key_padding_mask),
      draw.generator(training), training, &neighbours);
  return with_output(output, neighbour_fields(neighbours));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_project_qkv_op(
    const at::Tensor& input, const at::Tensor& query_weight, const c10::optional<at::Tensor>& query_bias,
    const at::Tensor& key_weight, const c10::optional<at::Tensor>& key_bias, const at::Tensor& value_weight,
    const c10::optional<at::Tensor>& value_bias) {
  const auto linear = [](const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
    return detail::LinearTensors{weight, bias.value_or(at::Tensor())};
  };
  detail::AttentionTensors tensors;
  tensors.query = linear(query_weight, query_bias);
  tensors.key = linear(key_weight, key_bias);
  tensors.value = linear(value_weight, value_bias);
  return detail::project_qkv(tensors, input);
}

void attention_check_input_op(const OptionTexts& texts, const at::Tensor& input, const at::Tensor& weight) {
  detail::check_attention_input(attention_options(texts), input, weight);
}

at::Tensor layer_forward_impl(c10::string_view layer_name, const OptionTexts& texts, const at::Tensor& input,
                              const std::vector<std::string>& names, const std::vector<at::Tensor>& tensors,
                              bool training, c10::optional<at::Generator> generator,
                              const c10::optional<at::Tensor>& mask, Neighbours* neighbours) {
  const std::string layer(layer_name);
  const NamedTensors named(names, tensors);
  return with_layer(layer, [&](auto kind) -> at::Tensor {
    using Layer = decltype(kind);
    const auto options = layer_options(kind, texts, layer);
    if constexpr (std::is_same_v<Layer, AttentionLayer>) {
      const auto draw = CandidateDraw::with_generator(generator, options.eval_candidates(), options.eval_seed());
      return detail::attention_forward(options, input, attention_tensors(named, mask), draw.generator(training),
                                       training, neighbours);
    } else if constexpr (kIsBranching<Layer>) {
      detail::BranchingTensors t;
      if (detail::convnn_branch_channels(options) > 0) t.convnn = named.convnn("convnn_branch.");
      t.conv = named.linear("conv_branch");
      t.mix = named.linear("mix");
      const auto& branch = options.convnn();
      const auto draw = CandidateDraw::with_generator(generator, branch.eval_candidates(), branch.eval_seed());
      return detail::branching_forward(options, input, t, draw.generator(training), neighbours);
    } else {
      const auto draw = CandidateDraw::with_generator(generator, options.eval_candidates(), options.eval_seed());
      return detail::convnn_forward(options, input, named.convnn(""), draw.generator(training), neighbours);
    }
  });
}

at::Tensor layer_forward(c10::string_view layer, const OptionTexts& texts, const at::Tensor& input,
                         const std::vector<std::string>& names, const std::vector<at::Tensor>& tensors,
                         bool training, c10::optional<at::Generator> generator,
                         const c10::optional<at::Tensor>& mask) {
  return layer_forward_impl(layer, texts, input, names, tensors, training, std::move(generator), mask, nullptr);
}

auto layer_forward_with_neighbours(c10::string_view layer, const OptionTexts& texts, const at::Tensor& input,
                                   const std::vector<std::string>& names, const std::vector<at::Tensor>& tensors,
                                   bool training, c10::optional<at::Generator> generator,
                                   const c10::optional<at::Tensor>& mask) {
  Neighbours neighbours;
  const auto output =
      layer_forward_impl(layer, texts, input, names, tensors, training, std::move(generator), mask, &neighbours);
  TORCH_CHECK(neighbours.indices.defined(), layer, ": this layer selects no neighbours (a branching layer with ",
              "lambda = 0 has no ConvNN branch)");
  return with_output(output, neighbour_fields(neighbours));
}

Neighbours neighbours_of(const at::Tensor& indices, const at::Tensor& scores, const at::Tensor& weights,
                         const c10::optional<at::Tensor>& positions, std::vector<int64_t> input_sizes,
                         std::vector<int64_t> query_grid, std::vector<int64_t> stride, std::vector<int64_t> dilation,
                         int64_t k, bool has_window) {
  Neighbours n;
  n.indices = indices;
  n.scores = scores;
  n.weights = weights;
  n.positions = positions.value_or(at::Tensor());
  n.input_sizes = std::move(input_sizes);
  n.query_grid = std::move(query_grid);
  n.stride = std::move(stride);
  n.dilation = std::move(dilation);
  n.k = k;
  n.has_window = has_window;
  const auto dims = n.input_sizes.size();
  TORCH_CHECK(!n.positions.defined() || (n.query_grid.size() == dims && n.stride.size() == dims &&
                                         n.dilation.size() == dims && n.positions.size(-1) == static_cast<int64_t>(dims)),
              "neighbour_view: input_sizes ", c10::IntArrayRef(n.input_sizes), ", query_grid ",
              c10::IntArrayRef(n.query_grid), ", stride ", c10::IntArrayRef(n.stride), ", dilation ",
              c10::IntArrayRef(n.dilation), " and the positions' last dimension must all have one entry per axis");
  return n;
}

functional::ConvNNFuncOptions func_options(const OptionTexts& texts, const char* where,
                                           const c10::optional<at::Generator>& generator) {
  functional::ConvNNFuncOptions options(1);
  apply_option_texts(options, texts, /*required=*/1, where);
  options.generator(generator);
  return options;
}

at::Tensor conv_nn_op(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
                      const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, const OptionTexts& texts,
                      const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& coordinates,
                      c10::optional<at::Generator> generator) {
  auto options = func_options(texts, "conv_nn", generator);
  options.mask(mask.value_or(at::Tensor()));
  return functional::conv_nn(queries, keys, values, kernel, bias.value_or(at::Tensor()), options,
                             coordinates.value_or(at::Tensor()));
}

at::Tensor conv_nn1d_op(const at::Tensor& input, const at::Tensor& kernel, const c10::optional<at::Tensor>& bias,
                        const OptionTexts& texts, c10::optional<at::Generator> generator) {
  return functional::conv_nn1d(input, kernel, bias.value_or(at::Tensor()), func_options(texts, "conv_nn1d", generator));
}

at::Tensor conv_nn2d_op(const at::Tensor& input, const at::Tensor& kernel, const c10::optional<at::Tensor>& bias,
                        const OptionTexts& texts, c10::optional<at::Generator> generator) {
  return functional::conv_nn2d(input, kernel, bias.value_or(at::Tensor()), func_options(texts, "conv_nn2d", generator));
}

at::Tensor conv_nn3d_op(const at::Tensor& input, const at::Tensor& kernel, const c10::optional<at::Tensor>& bias,
                        const OptionTexts& texts, c10::optional<at::Generator> generator) {
  return functional::conv_nn3d(input, kernel, bias.value_or(at::Tensor()), func_options(texts, "conv_nn3d", generator));
}

std::tuple<std::vector<std::string>, std::vector<std::string>, std::vector<std::string>, int64_t>
functional_option_fields() {
  std::vector<std::string> names, types, defaults;
  functional::ConvNNFuncOptions options(1);
  detail::visit_option_fields(options, [&](const char* name, auto& field) {
    names.emplace_back(name);
    types.emplace_back(FieldText::type(field));
    defaults.push_back(FieldText::format(field));
  });
  return {names, types, defaults, 1};
}

}  // namespace

namespace detail {

namespace {
template <typename Options>
std::vector<std::string> texts_of(Options& options) {
  std::vector<std::string> texts;
  visit_option_fields(options, [&](const char* name, auto& field) {
    texts.push_back(std::string(name) + "=" + FieldText::format(field));
  });
  return texts;
}
}  // namespace

std::vector<std::string> option_texts(ConvNN2dOptions options) { return texts_of(options); }
std::vector<std::string> option_texts(BranchingConv2dOptions options) { return texts_of(options); }
std::vector<std::string> option_texts(ConvNNAttentionOptions options) { return texts_of(options); }

torch::nn::AnyModule make_layer(const std::string& layer, const std::vector<std::string>& options) {
  return with_layer(layer, [&](auto kind) {
    using Layer = decltype(kind);
    return torch::nn::AnyModule(typename Layer::Module(layer_options(kind, options, layer)));
  });
}

}  // namespace detail

TORCH_LIBRARY_FRAGMENT(convnn, m) {
  m.def("layer_option_fields(str layer) -> (str[] names, str[] types, str[] defaults, int required)",
        [](c10::string_view layer) { return layer_option_fields(std::string(layer)); });
  m.def("option_aliases() -> (str[] aliases, str[] options)", [] {
    std::vector<std::string> aliases, options;
    for (const auto& [alias, option] : detail::kOptionAliases) {
      aliases.emplace_back(alias);
      options.emplace_back(option);
    }
    return std::make_tuple(aliases, options);
  });
  m.def("functional_option_fields() -> (str[] names, str[] types, str[] defaults, int required)",
        &functional_option_fields);
  m.def("layer_parameters(str layer, str[] options) -> (str[] names, Tensor[] tensors, bool[] trainable)",
        [](c10::string_view layer, const OptionTexts& texts) { return layer_parameters(std::string(layer), texts); });
  m.def("layer_submodules(str layer, str[] options) -> (str[] names, str[] kinds, int[] geometry)",
        [](c10::string_view layer, const OptionTexts& texts) { return layer_submodules(std::string(layer), texts); });
  m.def("layer_forward(str layer, str[] options, Tensor input, str[] names, Tensor[] tensors, bool training, "
        "Generator? generator=None, Tensor? mask=None) -> Tensor");
  m.def("attention_aggregate(str[] options, Tensor queries, Tensor keys, Tensor values, str[] names, "
        "Tensor[] tensors, bool training, Generator? generator=None, Tensor? mask=None, "
        "Tensor? key_padding_mask=None) -> Tensor");
  m.def("attention_aggregate_packed(str[] options, Tensor queries, Tensor keys, Tensor values, str[] names, "
        "Tensor[] tensors, bool training, Tensor cu_seqlens) -> Tensor");
  m.def("attention_static_step(str[] options, Tensor queries, Tensor keys, Tensor values, str[] names, "
        "Tensor[] tensors, bool training, Tensor(a!) cache_keys, Tensor(b!) cache_values, Tensor(c!) lengths) -> "
        "Tensor");
  m.def("attention_cache_geometry(str[] options) -> int[]", [](const OptionTexts& texts) {
    return detail::cache_geometry(attention_options(texts));
  });
  m.def("attention_step(str[] options, Tensor queries, Tensor keys, Tensor values, str[] names, Tensor[] tensors, "
        "bool training, Tensor(a!) cache_keys, Tensor(b!) cache_values, int[] lengths, int[] counts) -> "
        "(Tensor output, int[] lengths)");
  static const auto forward_schema = std::string("layer_forward_with_neighbours(str layer, str[] options, Tensor input, str[] names, "
                    "Tensor[] tensors, bool training, Generator? generator=None, Tensor? mask=None) -> (Tensor output, ") +
        kNeighbourFields + ")";
  m.def(forward_schema.c_str());
  static const auto aggregate_schema = std::string("attention_aggregate_with_neighbours(str[] options, Tensor queries, Tensor keys, Tensor values, "
                    "str[] names, Tensor[] tensors, bool training, Generator? generator=None, Tensor? mask=None, "
                    "Tensor? key_padding_mask=None) -> (Tensor output, ") +
        kNeighbourFields + ")";
  m.def(aggregate_schema.c_str());
  static const auto token_grid_schema = std::string("neighbours_on_token_grid(Tensor indices, Tensor scores, Tensor weights, int k, int[] grid, "
                    "int prefix_tokens) -> (") +
            kNeighbourFields + ")";
  m.def(token_grid_schema.c_str(),
        [](const at::Tensor& indices, const at::Tensor& scores, const at::Tensor& weights, int64_t k,
           std::vector<int64_t> grid, int64_t prefix_tokens) {
          auto n = neighbours_of(indices, scores, weights, c10::nullopt, {}, {}, {}, {}, k, false);
          return neighbour_fields(on_token_grid(n, grid, prefix_tokens));
        });
  m.def("neighbour_view(Tensor positions, Tensor weights, int[] input_sizes, int[] query_grid, int[] stride, "
        "int[] dilation, int k, bool has_window, float[] point, int sample=0) -> (int row, int[] query, "
        "Tensor neighbours, Tensor weights, Tensor window)",
        [](const at::Tensor& positions, const at::Tensor& weights, std::vector<int64_t> input_sizes,
           std::vector<int64_t> query_grid, std::vector<int64_t> stride, std::vector<int64_t> dilation, int64_t k,
           bool has_window, std::vector<double> point, int64_t sample) {
          const auto n = neighbours_of(positions, weights, weights, positions, std::move(input_sizes),
                                       std::move(query_grid), std::move(stride), std::move(dilation), k, has_window);
          auto view = neighbour_view(n, point, sample);
          return std::make_tuple(view.row, view.query, view.neighbours, view.weights, view.window);
        });
  m.def("window_side(int k, int spatial_dims) -> int", &window_side);
  m.def("attention_check_input(str[] options, Tensor input, Tensor weight) -> ()");
  // ConvNNAttention's three projections (detail::project_qkv: one GEMM where they allow it), for the
  // Python layer when its projections are plain nn.Linear modules.
  m.def("attention_project_qkv(Tensor input, Tensor query_weight, Tensor? query_bias, Tensor key_weight, "
        "Tensor? key_bias, Tensor value_weight, Tensor? value_bias) -> (Tensor, Tensor, Tensor)");
  m.def("conv_nn(Tensor queries, Tensor keys, Tensor values, Tensor kernel, Tensor? bias, str[] options, "
        "Tensor? mask=None, Tensor? coordinates=None, Generator? generator=None) -> Tensor");
  m.def("conv_nn1d(Tensor input, Tensor kernel, Tensor? bias, str[] options, Generator? generator=None) -> Tensor");
  m.def("conv_nn2d(Tensor input, Tensor kernel, Tensor? bias, str[] options, Generator? generator=None) -> Tensor");
  m.def("conv_nn3d(Tensor input, Tensor kernel, Tensor? bias, str[] options, Generator? generator=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(convnn, CompositeImplicitAutograd, m) {
  m.impl("layer_forward", &layer_forward);
  m.impl("layer_forward_with_neighbours", &layer_forward_with_neighbours);
  m.impl("attention_aggregate", &attention_aggregate_op);
  m.impl("attention_aggregate_with_neighbours", &attention_aggregate_with_neighbours);
  m.impl("attention_aggregate_packed", &attention_aggregate_packed_op);
  m.impl("attention_step", &attention_step_op);
  m.impl("attention_static_step", &attention_static_step_op);
  m.impl("attention_check_input", &attention_check_input_op);
  m.impl("attention_project_qkv", &attention_project_qkv_op);
  m.impl("conv_nn", &conv_nn_op);
  m.impl("conv_nn1d", &conv_nn1d_op);
  m.impl("conv_nn2d", &conv_nn2d_op);
  m.impl("conv_nn3d", &conv_nn3d_op);
}

// torch.vmap meets an op before its composite kernel runs, and PyTorch's per-sample fallback
// cannot take a Tensor[] argument; under this key vmap decomposes the composites instead, into
// ATen ops and the core ops, which have batching rules (python/convnn/_vmap.py).
TORCH_LIBRARY_IMPL(convnn, FuncTorchBatchedDecomposition, m) {
  m.impl("layer_forward", &layer_forward);
  m.impl("attention_aggregate", &attention_aggregate_op);
  m.impl("attention_check_input", &attention_check_input_op);
  m.impl("attention_project_qkv", &attention_project_qkv_op);
  m.impl("conv_nn", &conv_nn_op);
  m.impl("conv_nn1d", &conv_nn1d_op);
  m.impl("conv_nn2d", &conv_nn2d_op);
  m.impl("conv_nn3d", &conv_nn3d_op);
}

}  // namespace convnn::nn
