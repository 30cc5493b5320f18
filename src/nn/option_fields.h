#pragma once
// Every option of the layers as (name, field), in one visitor per options struct, and the text
// form of each field type: the one list from which the layer ops (src/nn/layer_ops.cpp) report
// names, types and defaults to Python and read the options Python passes back. The C++ options
// structs (convnn/nn/options/convnn.h) keep the defaults; nothing restates them.
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "convnn/nn/options/convnn.h"

namespace convnn::nn::detail {

// Other names options go by in PyTorch, timm and NATTEN, accepted wherever options are given by
// name (the layer ops, hence the Python layers): {alias, option}. An alias applies to a layer that
// has the option and not the alias (ConvNN2d's heads may be given as num_heads).
inline constexpr std::pair<const char*, const char*> kOptionAliases[] = {
    {"num_heads", "heads"},
    {"num_kv_heads", "kv_heads"},
    {"is_causal", "causal"},
};

// The operator's options (functional forms); the mask and generator travel as op arguments.
template <typename Visit>
void visit_option_fields(functional::ConvNNFuncOptions& o, Visit&& visit) {
  visit("k", o.k());
  visit("similarity", o.similarity());
  visit("heads", o.heads());
  visit("kv_heads", o.kv_heads());
  visit("alpha", o.alpha());
  visit("coordinates", o.coordinates());
  visit("padding", o.padding());
  visit("stride", o.stride());
  visit("dilation", o.dilation());
  visit("num_candidates", o.num_candidates());
  visit("include_self", o.include_self());
  visit("slot_order", o.slot_order());
  visit("rho", o.rho());
  visit("temperature", o.temperature());
  visit("kernel_per_head", o.kernel_per_head());
  visit("fused", o.fused());
}

// visit(name, field&) for the options of ConvNN1d, ConvNN2d and ConvNN3d.
template <size_t D, typename Visit>
void visit_option_fields(ConvNNOptions<D>& o, Visit&& visit, bool with_channels = true) {
  if (with_channels) {
    visit("in_channels", o.in_channels());
    visit("out_channels", o.out_channels());
  }
  visit("k", o.k());
  visit("similarity", o.similarity());
  visit("heads", o.heads());
  visit("coordinates", o.coordinates());
  visit("alpha", o.alpha());
  visit("padding", o.padding());
  visit("stride", o.stride());
  visit("dilation", o.dilation());
  visit("num_candidates", o.num_candidates());
  visit("include_self", o.include_self());
  visit("eval_candidates", o.eval_candidates());
  visit("eval_seed", o.eval_seed());
  visit("seed", o.seed());
  visit("slot_order", o.slot_order());
  visit("rho", o.rho());
  visit("temperature", o.temperature());
  visit("aggregation", o.aggregation());
  visit("learnable_kernel", o.learnable_kernel());
  visit("kernel_init", o.kernel_init());
  visit("kernel_per_head", o.kernel_per_head());
  visit("fused", o.fused());
  visit("bias", o.bias());
  visit("projection", o.projection());
  visit("qk_channels", o.qk_channels());
  visit("projection_bias", o.projection_bias());
}

// ConvNNAttention; its fixed mask is a tensor and travels as a tensor, not as an option.
template <typename Visit>
void visit_option_fields(ConvNNAttentionOptions& o, Visit&& visit) {
  visit("embed_dim", o.embed_dim());
  visit("num_heads", o.num_heads());
  visit("k", o.k());
  visit("num_kv_heads", o.num_kv_heads());
  visit("similarity", o.similarity());
  visit("rho", o.rho());
  visit("temperature", o.temperature());
  visit("slot_order", o.slot_order());
  visit("aggregation", o.aggregation());
  visit("learnable_kernel", o.learnable_kernel());
  visit("kernel_init", o.kernel_init());
  visit("kernel_per_head", o.kernel_per_head());
  visit("fused", o.fused());
  visit("bias", o.bias());
  visit("qkv_bias", o.qkv_bias());
  visit("out_bias", o.out_bias());
  visit("dropout", o.dropout());
  visit("causal", o.causal());
  visit("num_candidates", o.num_candidates());
  visit("include_self", o.include_self());
  visit("eval_candidates", o.eval_candidates());
  visit("eval_seed", o.eval_seed());
  visit("seed", o.seed());
}

// BranchingConv2d / 3d: its own options, then its ConvNN branch's under their own names (the
// branch's channel counts follow from in_channels, out_channels and lambda).
template <size_t D, typename Visit>
void visit_option_fields(BranchingConvOptions<D>& o, Visit&& visit) {
  visit("in_channels", o.in_channels());
  visit("out_channels", o.out_channels());
  visit("lambda", o.lambda());
  visit("kernel_size", o.kernel_size());
  visit_option_fields(o.convnn(), visit, /*with_channels=*/false);
}

// The text form of each field type, and its type name as Python sees it.
struct FieldText {
  static const char* type(const int64_t&) { return "int"; }
  static const char* type(const uint64_t&) { return "int"; }
  static const char* type(const c10::optional<uint64_t>&) { return "int?"; }
  static const char* type(const double&) { return "float"; }
  static const char* type(const bool&) { return "bool"; }
  static const char* type(const std::vector<int64_t>&) { return "int[]"; }
  template <size_t D>
  static const char* type(const torch::ExpandingArray<D>&) { return "int[]"; }
  template <typename Enum>
  static const char* type(const Enum&) { return "str"; }

  static std::string format(int64_t v) { return std::to_string(v); }
  static std::string format(uint64_t v) { return std::to_string(v); }
  static std::string format(const c10::optional<uint64_t>& v) { return v ? std::to_string(*v) : "none"; }
  static std::string format(double v);
  static std::string format(bool v) { return v ? "true" : "false"; }
  static std::string format(c10::ArrayRef<int64_t> v);  // "2" or "1,2"
  static std::string format(const std::vector<int64_t>& v) { return format(c10::ArrayRef<int64_t>(v)); }
  template <size_t D>
  static std::string format(const torch::ExpandingArray<D>& v) { return format(c10::ArrayRef<int64_t>(*v)); }
  template <typename Enum, typename = std::enable_if_t<std::is_enum_v<Enum>>>
  static std::string format(Enum v) { return to_string(v); }

  static void parse(std::string_view name, std::string_view text, int64_t& field);
  static void parse(std::string_view name, std::string_view text, uint64_t& field);
  static void parse(std::string_view name, std::string_view text, c10::optional<uint64_t>& field);
  static void parse(std::string_view name, std::string_view text, double& field);
  static void parse(std::string_view name, std::string_view text, bool& field);
  // One or more integers, comma separated.
  static void parse(std::string_view name, std::string_view text, std::vector<int64_t>& field);
  // One integer for every axis, or D of them.
  template <size_t D>
  static void parse(std::string_view name, std::string_view text, torch::ExpandingArray<D>& field) {
    std::vector<int64_t> values;
    parse(name, text, values);
    TORCH_CHECK(values.size() == 1 || values.size() == D, "option ", name, " must be one integer or ", D,
                " (one per axis), got '", text, "'");
    field = values.size() == 1 ? torch::ExpandingArray<D>(values[0]) : torch::ExpandingArray<D>(values);
  }
  static void parse(std::string_view name, std::string_view text, Similarity& field);
  static void parse(std::string_view name, std::string_view text, Rho& field);
  static void parse(std::string_view name, std::string_view text, SlotOrder& field);
  static void parse(std::string_view name, std::string_view text, Aggregation& field);
  static void parse(std::string_view name, std::string_view text, EvalCandidates& field);
  static void parse(std::string_view name, std::string_view text, KernelInit& field);
  static void parse(std::string_view name, std::string_view text, Projection& field);
};

}  // namespace convnn::nn::detail
