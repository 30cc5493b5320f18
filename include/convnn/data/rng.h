#pragma once
// Counter-based randomness for data loading: every draw is a pure function of a key (stream,
// seed, epoch, sample or batch index), never of torch's global generator or of which thread drew
// it, so a run is identical whatever the number of loader threads and can resume at any batch.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>

namespace convnn::data {

// splitmix64 (Steele, Lea and Flood, 2014).
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class Rng {
 public:
  // Each key word goes through a full mixing step, so nearby keys give unrelated streams.
  Rng(uint64_t stream, uint64_t seed, uint64_t a, uint64_t b = 0) : state_(stream) {
    for (const uint64_t word : {seed, a, b}) {
      state_ ^= word;
      state_ = splitmix64(state_);
    }
  }
  /// Uniform in [0, 1).
  double uniform() { return static_cast<double>(splitmix64(state_) >> 11) * 0x1.0p-53; }
  /// Uniform in [lo, hi).
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  /// Uniform integer in [0, n).
  int64_t below(int64_t n) {
    return std::min(n - 1, static_cast<int64_t>(uniform() * static_cast<double>(n)));
  }
  bool bernoulli(double p) { return uniform() < p; }
  /// Standard normal (Box-Muller; one value per call, so the count of draws is fixed).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  /// Gamma(shape, 1) (Marsaglia and Tsang, 2000), for Beta draws.
  double gamma(double shape) {
    if (shape < 1.0) return gamma(shape + 1.0) * std::pow(uniform() + 1e-300, 1.0 / shape);
    const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      double x = 0.0, v = 0.0;
      do {
        x = normal();
        v = 1.0 + c * x;
      } while (v <= 0.0);
      v = v * v * v;
      const double u = uniform();
      if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
      if (std::log(u + 1e-300) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
    }
  }
  /// Beta(a, b).
  double beta(double a, double b) {
    const double x = gamma(a), y = gamma(b);
    return x / (x + y);
  }

 private:
  uint64_t state_;
};

}  // namespace convnn::data
