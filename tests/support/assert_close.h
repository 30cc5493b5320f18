#pragma once
// Tolerance helpers for the test suite. Tolerances come from a float64 reference: a result in
// dtype T is compared with the float64 result, and allowed a small multiple of T's epsilon.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

namespace convnn::testing {

// Largest |a - b| over all elements (0 for empty tensors), computed in float64; equal infinities
// count as equal.
double max_abs_diff(const at::Tensor& a, const at::Tensor& b);

// Machine epsilon of a floating dtype.
double epsilon_of(at::ScalarType dtype);

// EXPECT-style check: same shape, and max |actual - expected| <= atol + rtol * max|expected|
// (the maximum over finite expected values).
::testing::AssertionResult AllClose(const at::Tensor& actual, const at::Tensor& expected,
                                    double atol, double rtol = 0.0);

// Two results of one CPU op at different thread counts: bitwise equal where convnn's fused CPU
// kernels serve the CPU (their sums are fixed trees: the result does not depend on the thread
// count); under CONVNN_CPU_KERNELS=generic to rounding (64 epsilons of the dtype relative to the
// largest |expected|; 2 for half precision, whose results are rounded once more), since the generic
// path promises bitwise repeats at one thread count only (docs/operator.md): ATen's matrix products
// may split their sums by thread (MKL on an Intel Xeon rounded one and two threads apart).
::testing::AssertionResult SameAcrossThreadCounts(const at::Tensor& actual, const at::Tensor& expected);

}  // namespace convnn::testing
