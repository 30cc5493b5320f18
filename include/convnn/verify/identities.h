#pragma once
// The identities of DESIGN.md §2 (convolution, attention, KVT, masked attention, multi-head), each
// checked on fresh random inputs against an independent implementation. Used by `convnn verify`
// and by the test suite.
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace convnn::verify {

struct IdentityResult {
  std::string identity;       // e.g. "conv2d/standard/padded"
  std::string configuration;  // the shapes and options it ran with
  double max_abs_error = 0.0;
  double tolerance = 0.0;
  bool passed = false;
};

/// Tolerance used for every identity in `dtype`: 1e-5 for float32, 1e-10 for float64.
double identity_tolerance(c10::ScalarType dtype);

/// Runs every identity once in `dtype` (float32 or float64) with inputs drawn from `seed`.
std::vector<IdentityResult> run_identities(c10::ScalarType dtype, uint64_t seed);

}  // namespace convnn::verify
