// Names and properties of the rhos, read off their policies (ops/kernels/rho.h).
#include "convnn/ops/rho.h"

#include <c10/util/Exception.h>

#include "util/enum_names.h"
#include "ops/kernels/rho.h"

namespace convnn {

Rho parse_rho(std::string_view name) { return parse_rho_argument(name, "rho"); }

Rho parse_rho_argument(std::string_view name, const char* argument) {
  return static_cast<Rho>(detail::index_of_name(rho_names(), name, argument));
}

const char* to_string(Rho rho) {
  return kernels::dispatch_rho(rho, [](auto policy) { return decltype(policy)::kName; });
}

const std::vector<std::string>& rho_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    for (int value = 0; value < kRhoCount; ++value) {
      kernels::dispatch_rho(static_cast<Rho>(value), [&](auto policy) {
        // The policies' kinds must be the enum's values in order: names[value] is value's name.
        TORCH_INTERNAL_ASSERT(static_cast<int>(decltype(policy)::kKind) == value);
        all.emplace_back(decltype(policy)::kName);
      });
    }
    return all;
  }();
  return names;
}

bool rho_has_score_gradient(Rho rho) {
  return kernels::dispatch_rho(rho, [](auto policy) { return decltype(policy)::kHasScoreGradient; });
}

}  // namespace convnn
