#pragma once
// Float64 finite-difference gradient check. The output is projected on a fixed random direction r,
// L(x) = <f(x), r>, and every element of dL/dx from autograd is compared with the central
// difference (L(x + eps e_i) - L(x - eps e_i)) / (2 eps). Inputs must be float64; only those that
// require grad are checked.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <vector>

namespace convnn::testing {

using TensorFunction = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

struct GradCheckOptions {
  double eps = 1e-6;
  double atol = 1e-7;
  double rtol = 1e-5;
  uint64_t seed = 0;
};

::testing::AssertionResult GradCheck(const TensorFunction& f, const std::vector<at::Tensor>& inputs,
                                     const GradCheckOptions& options = {});

}  // namespace convnn::testing
