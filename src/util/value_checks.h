#pragma once
// Checks that several configs share (c10::Error naming the option and its value).
#include <c10/util/Exception.h>

#include <cmath>

namespace convnn::detail {

inline void check_finite_non_negative(double value, const char* option) {
  TORCH_CHECK(std::isfinite(value) && value >= 0.0, option, " must be a finite non-negative number, got ",
              value);
}

}  // namespace convnn::detail
