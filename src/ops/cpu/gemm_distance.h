#pragma once
// Gaussian's squared distances through the GEMM identity, with bounds that let the exact sums decide.
//
// The fused CPU select ranks Gaussian candidates by f(q, k), the float32 sum over the features, in
// their order, of (q_j - k_j)^2 (docs/operator.md, "Ties"): two operations per feature pair, in the
// generic register-blocked loop. A GEMM computes the dot products of a whole tile at the machine's
// rate, and a = |q|^2 + |k|^2 - 2 q.k is f in exact arithmetic, but not in float32. How far apart:
// for any order of summation in the GEMM and in the norms, fused multiply-adds or not (Higham,
// "Accuracy and Stability of Numerical Algorithms", 2nd ed., section 3.1),
//     |a - f| <= 2 gamma(d + 3) (|q| + |k|)^2,   gamma(n) = n u / (1 - n u),   u = 2^-24,
// ignoring underflow, whose absolute error is at most FLT_MIN per operation (flushed or gradual).
// bound(a) below is at least twice that, plus 4 u |a| and 16 (d + 2) FLT_MIN: enough that the
// float32 values of -a - bound and -a + bound, each rounded once more, still enclose -f.
//
// The selection then ranks by those bounds instead of -f: tau = the K-th largest lower bound is at
// most the K-th largest -f (K keys have -f at or above their lower bounds), so every key of the top
// K, ties at the K-th included, has an upper bound >= tau. The keys that do (about K on random rows)
// are ranked by f, computed as the direct path computes it: the same indices and scores, bit for
// bit. Masks keep the enclosure: a distance's additive mask holds only 0 and -inf.
//
// Included only by kernel files (ops/cpu/isa.h).
#include <cmath>
#include <cstdint>
#include <limits>

namespace convnn::cpu::CONVNN_CPU_ISA {
namespace {

class DistanceBounds {
 public:
  explicit DistanceBounds(int64_t features)
      : relative_(8.0f * static_cast<float>(features + 2) * kUnitRoundoff),
        absolute_(16.0f * static_cast<float>(features + 2) * std::numeric_limits<float>::min()) {}

  // Whether every bound of a query of norm q_root against keys of norm at most key_root_max is
  // finite (else the row takes the exact sums alone): (|q| + |k|)^2 well inside float32's range.
  static bool finite(float q_root, float key_root_max) {
    const float reach = q_root + key_root_max;
    return std::isfinite(reach) && std::isfinite(64.0f * reach * reach);
  }

  // Lower and upper bounds on -f for `columns` keys, from their dot products with the query and
  // the squared norms and norms of both.
  void row(float q_square, float q_root, const float* dots, const float* key_squares, const float* key_roots,
           int64_t columns, float* lower, float* upper) const {
    for (int64_t c = 0; c < columns; ++c) {
      const float approximate = (q_square + key_squares[c]) - 2.0f * dots[c];
      const float reach = q_root + key_roots[c];
      const float bound = relative_ * reach * reach + 4.0f * kUnitRoundoff * std::abs(approximate) + absolute_;
      lower[c] = -approximate - bound;
      upper[c] = -approximate + bound;
    }
  }

 private:
  static constexpr float kUnitRoundoff = 0x1p-24f;
  float relative_, absolute_;
};

}  // namespace
}  // namespace convnn::cpu::CONVNN_CPU_ISA
