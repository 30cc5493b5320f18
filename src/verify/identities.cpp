#include "convnn/verify/identities.h"

namespace convnn::verify {

double identity_tolerance(c10::ScalarType dtype) {
  return dtype == c10::ScalarType::Double ? 1e-10 : 1e-5;
}

std::vector<IdentityResult> run_identities(c10::ScalarType dtype, uint64_t seed) {
  return {};
}

}  // namespace convnn::verify
