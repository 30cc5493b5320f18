// String names of the option enums, for the command line, configs and pretty_print.
#include <c10/util/Exception.h>

#include <string_view>

#include "convnn/nn/options/convnn.h"
#include "util/enum_names.h"

namespace convnn::nn {
namespace {

using convnn::detail::name_of;
using convnn::detail::NameTable;
using convnn::detail::table_names;
using convnn::detail::parse_name;

constexpr NameTable<SlotOrder, 2> kSlotOrder{
    {{"score", SlotOrder::Score}, {"index", SlotOrder::Index}}};
constexpr NameTable<Aggregation, 2> kAggregation{
    {{"standard", Aggregation::Standard}, {"depthwise", Aggregation::Depthwise}}};
constexpr NameTable<EvalCandidates, 2> kEvalCandidates{
    {{"fixed", EvalCandidates::Fixed}, {"fresh", EvalCandidates::Fresh}}};
constexpr NameTable<KernelInit, 2> kKernelInit{
    {{"default", KernelInit::Default}, {"ones", KernelInit::Ones}}};
constexpr NameTable<Projection, 2> kProjection{
    {{"identity", Projection::Identity}, {"linear", Projection::Linear}}};

}  // namespace

SlotOrder parse_slot_order(std::string_view t) { return parse_name(kSlotOrder, t, "slot_order"); }
Aggregation parse_aggregation(std::string_view t) { return parse_name(kAggregation, t, "aggregation"); }
EvalCandidates parse_eval_candidates(std::string_view t) {
  return parse_name(kEvalCandidates, t, "eval_candidates");
}
KernelInit parse_kernel_init(std::string_view t) { return parse_name(kKernelInit, t, "kernel_init"); }
Projection parse_projection(std::string_view t) { return parse_name(kProjection, t, "projection"); }
const char* to_string(SlotOrder v) { return name_of(kSlotOrder, v); }
const char* to_string(Aggregation v) { return name_of(kAggregation, v); }
const char* to_string(EvalCandidates v) { return name_of(kEvalCandidates, v); }
const char* to_string(KernelInit v) { return name_of(kKernelInit, v); }
const char* to_string(Projection v) { return name_of(kProjection, v); }
const std::vector<std::string>& slot_order_names() { return table_names<kSlotOrder>(); }
const std::vector<std::string>& aggregation_names() { return table_names<kAggregation>(); }
const std::vector<std::string>& eval_candidates_names() { return table_names<kEvalCandidates>(); }
const std::vector<std::string>& kernel_init_names() { return table_names<kKernelInit>(); }
const std::vector<std::string>& projection_names() { return table_names<kProjection>(); }

}  // namespace convnn::nn
