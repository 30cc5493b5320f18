#pragma once
// Name tables of option enums (nn options, models), for the command line, configs and
// pretty_print.
#include <c10/util/Exception.h>

#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace convnn::detail {

template <typename Enum, size_t N>
using NameTable = std::array<std::pair<const char*, Enum>, N>;

/// The value named `text`; otherwise a c10::Error naming the option, the value and the choices.
template <typename Enum, size_t N>
Enum parse_name(const NameTable<Enum, N>& names, std::string_view text, const char* option) {
  std::string allowed;
  for (const auto& [name, value] : names) {
    if (text == name) return value;
    allowed += allowed.empty() ? name : std::string(", ") + name;
  }
  TORCH_CHECK(false, option, " must be one of ", allowed, "; got '", text, "'");
}

/// The names of `names` in table order: the list a command line's choices, a public
/// <enum>_names() function and the tests read, so that no caller restates them.
template <typename Enum, size_t N>
std::vector<std::string> names_of(const NameTable<Enum, N>& names) {
  std::vector<std::string> all;
  all.reserve(N);
  for (const auto& entry : names) all.emplace_back(entry.first);
  return all;
}

/// names_of(Table), built once: what a public <enum>_names() function returns.
template <const auto& Table>
const std::vector<std::string>& table_names() {
  static const std::vector<std::string> names = names_of(Table);
  return names;
}

template <typename Enum, size_t N>
const char* name_of(const NameTable<Enum, N>& names, Enum value) {
  for (const auto& [name, v] : names) {
    if (v == value) return name;
  }
  return "unknown";
}

/// The position of `text` in `names` (an enum's names in value order); otherwise a c10::Error
/// naming the option, the value and the choices.
inline size_t index_of_name(const std::vector<std::string>& names, std::string_view text,
                            std::string_view option) {
  std::string allowed;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == text) return i;
    allowed += (allowed.empty() ? "" : ", ") + names[i];
  }
  TORCH_CHECK(false, option, " must be one of ", allowed, "; got '", text, "'");
}

}  // namespace convnn::detail
