// The enum name lists (and the cosine similarity's epsilon) as ops, so that Python reads the one
// definition (include/convnn/ops/similarity.h, rho.h) through the dispatcher instead of restating it.
#include <torch/library.h>

#include "convnn/ops/rho.h"
#include "convnn/ops/similarity.h"

namespace convnn {
namespace {

std::vector<std::string> similarity_name_list() { return similarity_names(); }
std::vector<std::string> rho_name_list() { return rho_names(); }
double cosine_eps() { return kCosineEps; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(convnn, m) {
  m.def("similarity_names() -> str[]", &similarity_name_list);
  m.def("rho_names() -> str[]", &rho_name_list);
  m.def("cosine_eps() -> float", &cosine_eps);
}

}  // namespace convnn
