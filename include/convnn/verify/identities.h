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

/// The dtypes the identities run in (float32, float64): the one table parse_dtype reads.
const std::vector<std::string>& dtype_names();
/// A name of dtype_names(); anything else throws c10::Error naming the text and the choices.
c10::ScalarType parse_dtype(const std::string& name);

/// Tolerance used for every identity in `dtype`: 1e-5 for float32, 1e-10 for float64.
double identity_tolerance(c10::ScalarType dtype);

/// Runs every identity once in `dtype` (float32 or float64) with inputs drawn from `seed`.
std::vector<IdentityResult> run_identities(c10::ScalarType dtype, uint64_t seed);

}  // namespace convnn::verify
