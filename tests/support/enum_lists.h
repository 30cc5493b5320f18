#pragma once
// Every value of the op enums, read from the library's one name list (similarity_names(),
// rho_names()), so that a parameterised test covers a new similarity or rho without an edit.
#include <ostream>
#include <vector>

#include "convnn/nn/options/convnn.h"
#include "convnn/ops/rho.h"
#include "convnn/ops/similarity.h"

namespace convnn {

// How GoogleTest prints a parameter of these types (by its name, not its bytes).
inline void PrintTo(Similarity similarity, std::ostream* os) { *os << to_string(similarity); }
inline void PrintTo(Rho rho, std::ostream* os) { *os << to_string(rho); }

namespace nn {
inline void PrintTo(Aggregation aggregation, std::ostream* os) { *os << to_string(aggregation); }
}  // namespace nn

}  // namespace convnn

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
