#include "support/assert_close.h"

#include <limits>
#include <sstream>

#include "ops/generic/generic.h"

namespace convnn::testing {

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0) return 0.0;
  const auto x = a.to(at::kDouble), y = b.to(at::kDouble);
  // Equal infinities (masked -inf scores) count as no difference, as in torch.allclose.
  return at::where(x == y, at::zeros_like(x), (x - y).abs()).max().item<double>();
}

double epsilon_of(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble: return std::numeric_limits<double>::epsilon();
    case at::kFloat: return std::numeric_limits<float>::epsilon();
    case at::kBFloat16: return 0.0078125;
    case at::kHalf: return 0.0009765625;
    default: return 0.0;
  }
}

::testing::AssertionResult AllClose(const at::Tensor& actual, const at::Tensor& expected,
                                    double atol, double rtol) {
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure()
           << "shape mismatch: " << actual.sizes() << " vs " << expected.sizes();
  }
  const double diff = max_abs_diff(actual, expected);
  const auto finite = expected.to(at::kDouble).masked_select(at::isfinite(expected));
  const double scale = finite.numel() ? finite.abs().max().item<double>() : 0.0;
  const double tolerance = atol + rtol * scale;
  if (diff <= tolerance) return ::testing::AssertionSuccess();
  std::ostringstream msg;
  msg << "max abs diff " << diff << " > tolerance " << tolerance << " (atol " << atol << ", rtol "
      << rtol << ", max|expected| " << scale << ")";
  return ::testing::AssertionFailure() << msg.str();
}

::testing::AssertionResult SameAcrossThreadCounts(const at::Tensor& actual, const at::Tensor& expected) {
  if (!convnn::ops::generic::serves_cpu()) {
    if (actual.sizes() == expected.sizes() && at::equal(actual, expected)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "not bitwise equal (max |difference| " << max_abs_diff(actual, expected)
                                         << ")";
  }
  const auto dtype = expected.scalar_type();
  const double epsilons = dtype == at::kBFloat16 || dtype == at::kHalf ? 2.0 : 64.0;
  return AllClose(actual, expected, 0.0, epsilons * epsilon_of(dtype));
}

}  // namespace convnn::testing
