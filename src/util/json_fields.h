#pragma once
// JSON for plain config structs (models::ModelConfig, train::TrainConfig): a config lists its
// fields once through visit_fields(config, visitor), and these helpers read and write them with
// the same checks everywhere. Enums travel by name through an `Enums` object of the caller with
// overloads `std::string name(E)` and `E parse(const std::string&, E*)`.
#include <c10/util/Exception.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>

namespace convnn::detail {

/// Configs and checkpoint headers nest a few levels; the cap keeps every recursion over a parsed
/// value (conversion, printing, destruction) far from the stack's end whatever a file holds.
constexpr int kMaxJsonDepth = 64;

/// A JSON value as an error message shows it: its text, cut to a few dozen characters.
inline std::string shown(const nlohmann::json& value) {
  constexpr size_t kShown = 40;
  auto text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > kShown) text = text.substr(0, kShown) + "...";
  return text;
}

/// `text` parsed as one JSON value nested at most kMaxJsonDepth levels, without NUL bytes (which
/// some readers take for the end of the text); errors raise a c10::Error that begins with `what`.
inline nlohmann::json parse_json(const std::string& text, const std::string& what) {
  const auto nul = text.find('\0');
  TORCH_CHECK(nul == std::string::npos, what, " is not valid JSON: a NUL byte at offset ", nul);
  try {
    return nlohmann::json::parse(text, [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
      TORCH_CHECK(depth <= kMaxJsonDepth, what, " is not valid here: its values nest more than ",
                  kMaxJsonDepth, " levels deep");
      return true;
    });
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e400
    TORCH_CHECK(false, what, " is not valid JSON: ", e.what());
  }
}

template <typename T>
struct is_optional : std::false_type {};
template <typename T>
struct is_optional<std::optional<T>> : std::true_type {};

/// Two numbers a struct keeps in two fields and the command line gives as one option of two values
/// (timm's --opt-betas, --scale, --ratio): one JSON key holding [first, second], so that the key
/// and the flag match. `T` is double or const double (writing).
template <typename T>
struct FieldPair {
  T& first;
  T& second;
};
template <typename T>
FieldPair<T> field_pair(T& first, T& second) {
  return {first, second};
}
template <typename T>
struct is_field_pair : std::false_type {};
template <typename T>
struct is_field_pair<FieldPair<T>> : std::true_type {};

template <typename T, typename Enums>
nlohmann::json field_to_json(const T& value, const Enums& enums) {
  if constexpr (is_optional<T>::value) {
    return value ? field_to_json(*value, enums) : nlohmann::json(nullptr);
  } else if constexpr (is_field_pair<T>::value) {
    return nlohmann::json::array({value.first, value.second});
  } else if constexpr (std::is_enum_v<T>) {
    return enums.name(value);
  } else {
    return value;
  }
}

template <typename T, typename Enums>
void field_from_json(const nlohmann::json& json, T& value, const char* what, const char* key,
                     const Enums& enums) {
  if constexpr (is_optional<T>::value) {
    if (json.is_null()) {
      value.reset();
      return;
    }
    typename T::value_type parsed{};
    field_from_json(json, parsed, what, key, enums);
    value = parsed;
  } else if constexpr (is_field_pair<T>::value) {
    TORCH_CHECK(json.is_array() && json.size() == 2 && json[0].is_number() && json[1].is_number(), what, ": ",
                key, " must be two numbers [first, second], got ", shown(json));
    value.first = json[0].template get<double>();
    value.second = json[1].template get<double>();
  } else if constexpr (std::is_enum_v<T>) {
    TORCH_CHECK(json.is_string(), what, ": ", key, " must be a name (string), got ", shown(json));
    value = enums.parse(json.get<std::string>(), static_cast<T*>(nullptr));
  } else if constexpr (std::is_same_v<T, bool>) {
    TORCH_CHECK(json.is_boolean(), what, ": ", key, " must be true or false, got ", shown(json));
    value = json.get<bool>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    TORCH_CHECK(json.is_string(), what, ": ", key, " must be a string, got ", shown(json));
    value = json.get<std::string>();
  } else if constexpr (std::is_unsigned_v<T>) {
    TORCH_CHECK(json.is_number_unsigned(), what, ": ", key,
                " must be a non-negative integer, got ", shown(json));
    value = json.get<T>();
  } else if constexpr (std::is_integral_v<T>) {
    TORCH_CHECK(json.is_number_integer(), what, ": ", key, " must be an integer, got ", shown(json));
    value = json.get<T>();
  } else if constexpr (std::is_floating_point_v<T>) {
    TORCH_CHECK(json.is_number(), what, ": ", key, " must be a number, got ", shown(json));
    value = json.get<T>();
  } else {
    from_json(json, value);  // a nested config with its own from_json
  }
}

/// Every field of `config` as one JSON object.
template <typename Config, typename VisitFields, typename Enums>
nlohmann::json config_to_json(const Config& config, VisitFields visit_fields, const Enums& enums) {
  auto json = nlohmann::json::object();
  visit_fields(config, [&](const char* key, const auto& field) {
    if constexpr (std::is_enum_v<std::decay_t<decltype(field)>> ||
                  is_optional<std::decay_t<decltype(field)>>::value ||
                  is_field_pair<std::decay_t<decltype(field)>>::value ||
                  std::is_arithmetic_v<std::decay_t<decltype(field)>> ||
                  std::is_same_v<std::decay_t<decltype(field)>, std::string>) {
      json[key] = field_to_json(field, enums);
    } else {
      json[key] = field;  // a nested config with its own to_json
    }
  });
  return json;
}

/// Reads any subset of the fields; unknown keys and ill-typed values raise, naming `what`.
template <typename Config, typename VisitFields, typename Enums>
void config_from_json(const nlohmann::json& json, Config& config, const char* what,
                      VisitFields visit_fields, const Enums& enums) {
  TORCH_CHECK(json.is_object(), what, " must be a JSON object, got ", shown(json));
  std::string known;
  // auto&&: a FieldPair arrives as a temporary.
  visit_fields(config, [&](const char* key, auto&& field) {
    known += known.empty() ? key : std::string(", ") + key;
    if (json.contains(key)) field_from_json(json.at(key), field, what, key, enums);
  });
  for (const auto& item : json.items()) {
    bool found = false;
    visit_fields(config, [&](const char* key, const auto&) { found = found || item.key() == key; });
    TORCH_CHECK(found, what, ": unknown option '", item.key(), "'; the options are ", known);
  }
}

}  // namespace convnn::detail
