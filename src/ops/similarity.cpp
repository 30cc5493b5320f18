// Names and properties of the similarities, read off their policies (ops/kernels/similarity.h).
#include "convnn/ops/similarity.h"

#include <c10/util/Exception.h>

#include "util/enum_names.h"
#include "ops/kernels/similarity.h"

namespace convnn {

Similarity parse_similarity(std::string_view name, std::string_view argument) {
  return static_cast<Similarity>(detail::index_of_name(similarity_names(), name, argument));
}

const char* to_string(Similarity similarity) {
  return kernels::dispatch_similarity(similarity, [](auto policy) { return decltype(policy)::kName; });
}

const std::vector<std::string>& similarity_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    kernels::for_each_similarity([&](auto policy) {
      using Policy = decltype(policy);
      // The policies' kinds must be the enum's values in order: names[value] is value's name.
      TORCH_INTERNAL_ASSERT(static_cast<size_t>(Policy::kKind) == all.size());
      all.emplace_back(Policy::kName);
    });
    return all;
  }();
  return names;
}

bool is_distance_similarity(Similarity similarity) {
  return kernels::dispatch_similarity(similarity,
                                      [](auto policy) { return decltype(policy)::kIsDistance; });
}

}  // namespace convnn
