#include "convnn/ops/similarity.h"

#include <c10/util/Exception.h>

#include <array>
#include <utility>

namespace convnn {
namespace {

constexpr std::array<std::pair<std::string_view, Similarity>, 5> kNames{{
    {"dot", Similarity::Dot},
    {"scaled_dot", Similarity::ScaledDot},
    {"cosine", Similarity::Cosine},
    {"gaussian", Similarity::Gaussian},
    {"chebyshev", Similarity::Chebyshev},
}};

}  // namespace

Similarity parse_similarity(std::string_view name, std::string_view argument) {
  for (const auto& [text, value] : kNames) {
    if (text == name) return value;
  }
  TORCH_CHECK(false, argument, " must be one of dot, scaled_dot, cosine, gaussian, chebyshev; got '",
              name, "'");
}

const char* to_string(Similarity similarity) {
  for (const auto& [text, value] : kNames) {
    if (value == similarity) return text.data();
  }
  return "unknown";
}

}  // namespace convnn
