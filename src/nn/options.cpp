// String names of the option enums, for the command line, configs and pretty_print.
#include <c10/util/Exception.h>

#include <array>
#include <string>
#include <utility>

#include "convnn/nn/options/convnn.h"

namespace convnn::nn {
namespace {

template <typename Enum, size_t N>
Enum parse(const std::array<std::pair<const char*, Enum>, N>& names, std::string_view text,
           const char* option) {
  std::string allowed;
  for (const auto& [name, value] : names) {
    if (text == name) return value;
    allowed += allowed.empty() ? name : std::string(", ") + name;
  }
  TORCH_CHECK(false, option, " must be one of ", allowed, "; got '", text, "'");
}

template <typename Enum, size_t N>
const char* name_of(const std::array<std::pair<const char*, Enum>, N>& names, Enum value) {
  for (const auto& [name, v] : names) {
    if (v == value) return name;
  }
  return "unknown";
}

constexpr std::array<std::pair<const char*, Rho>, 3> kRho{
    {{"uniform", Rho::Uniform}, {"mean", Rho::Mean}, {"softmax", Rho::Softmax}}};
constexpr std::array<std::pair<const char*, SlotOrder>, 2> kSlotOrder{
    {{"score", SlotOrder::Score}, {"index", SlotOrder::Index}}};
constexpr std::array<std::pair<const char*, Aggregation>, 2> kAggregation{
    {{"standard", Aggregation::Standard}, {"depthwise", Aggregation::Depthwise}}};
constexpr std::array<std::pair<const char*, EvalCandidates>, 2> kEvalCandidates{
    {{"fixed", EvalCandidates::Fixed}, {"fresh", EvalCandidates::Fresh}}};
constexpr std::array<std::pair<const char*, KernelInit>, 2> kKernelInit{
    {{"default", KernelInit::Default}, {"ones", KernelInit::Ones}}};
constexpr std::array<std::pair<const char*, Projection>, 2> kProjection{
    {{"identity", Projection::Identity}, {"linear", Projection::Linear}}};

}  // namespace

Rho parse_rho(std::string_view t) { return parse(kRho, t, "rho"); }
SlotOrder parse_slot_order(std::string_view t) { return parse(kSlotOrder, t, "slot_order"); }
Aggregation parse_aggregation(std::string_view t) { return parse(kAggregation, t, "aggregation"); }
EvalCandidates parse_eval_candidates(std::string_view t) {
  return parse(kEvalCandidates, t, "eval_candidates");
}
KernelInit parse_kernel_init(std::string_view t) { return parse(kKernelInit, t, "kernel_init"); }
Projection parse_projection(std::string_view t) { return parse(kProjection, t, "projection"); }
const char* to_string(Rho v) { return name_of(kRho, v); }
const char* to_string(SlotOrder v) { return name_of(kSlotOrder, v); }
const char* to_string(Aggregation v) { return name_of(kAggregation, v); }
const char* to_string(EvalCandidates v) { return name_of(kEvalCandidates, v); }
const char* to_string(KernelInit v) { return name_of(kKernelInit, v); }
const char* to_string(Projection v) { return name_of(kProjection, v); }

}  // namespace convnn::nn
