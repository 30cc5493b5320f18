#include "nn/option_fields.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace convnn::nn::detail {
namespace {

[[noreturn]] void bad_value(std::string_view name, std::string_view text, const char* rule) {
  TORCH_CHECK(false, "option ", name, " must be ", rule, ", got '", text, "'");
}

}  // namespace

std::string FieldText::format(double v) {
  std::ostringstream out;
  out.precision(17);  // round-trips every double
  out << v;
  return out.str();
}

void FieldText::parse(std::string_view name, std::string_view text, int64_t& field) {
  const std::string s(text);
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE) bad_value(name, text, "an integer");
  field = v;
}

std::string FieldText::format(c10::ArrayRef<int64_t> v) {
  std::string text;
  for (const int64_t x : v) text += (text.empty() ? "" : ",") + std::to_string(x);
  return text;
}

void FieldText::parse(std::string_view name, std::string_view text, std::vector<int64_t>& field) {
  std::vector<int64_t> values;
  std::string_view rest = text;
  while (true) {
    const auto comma = rest.find(',');
    int64_t value = 0;
    const auto item = rest.substr(0, comma);
    if (item.empty()) bad_value(name, text, "one or more integers, comma separated");
    parse(name, item, value);
    values.push_back(value);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  field = std::move(values);
}

void FieldText::parse(std::string_view name, std::string_view text, uint64_t& field) {
  const std::string s(text);
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || s[0] == '-' || *end != '\0' || errno == ERANGE) {
    bad_value(name, text, "a non-negative integer");
  }
  field = v;
}

void FieldText::parse(std::string_view name, std::string_view text, c10::optional<uint64_t>& field) {
  if (text == "none") {
    field = c10::nullopt;
    return;
  }
  uint64_t v = 0;
  parse(name, text, v);
  field = v;
}

void FieldText::parse(std::string_view name, std::string_view text, double& field) {
  const std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0') bad_value(name, text, "a number");
  field = v;
}

void FieldText::parse(std::string_view name, std::string_view text, bool& field) {
  if (text == "true" || text == "false") {
    field = text == "true";
    return;
  }
  bad_value(name, text, "true or false");
}

void FieldText::parse(std::string_view name, std::string_view text, Similarity& field) {
  field = parse_similarity(text, name);
}
void FieldText::parse(std::string_view, std::string_view text, Rho& field) { field = parse_rho(text); }
void FieldText::parse(std::string_view, std::string_view text, SlotOrder& field) {
  field = parse_slot_order(text);
}
void FieldText::parse(std::string_view, std::string_view text, Aggregation& field) {
  field = parse_aggregation(text);
}
void FieldText::parse(std::string_view, std::string_view text, EvalCandidates& field) {
  field = parse_eval_candidates(text);
}
void FieldText::parse(std::string_view, std::string_view text, KernelInit& field) {
  field = parse_kernel_init(text);
}
void FieldText::parse(std::string_view, std::string_view text, Projection& field) {
  field = parse_projection(text);
}

}  // namespace convnn::nn::detail
