#pragma once
// Every value of the op enums, read from the library's one name list (similarity_names(),
// rho_names()), so that a parameterised test covers a new similarity or rho without an edit.
#include <vector>

#include "convnn/ops/rho.h"
#include "convnn/ops/similarity.h"

namespace convnn::testing {

inline std::vector<Similarity> all_similarities() {
  std::vector<Similarity> all;
  for (const auto& name : similarity_names()) all.push_back(parse_similarity(name));
  return all;
}

inline std::vector<Rho> all_rhos() {
  std::vector<Rho> all;
  for (const auto& name : rho_names()) all.push_back(parse_rho(name));
  return all;
}

}  // namespace convnn::testing
