#pragma once
// Similarity functions of knn_select. Larger always means more similar.
//   dot        q.k
//   scaled_dot q.k / sqrt(D)
//   cosine     q.k / (max(|q|,eps) max(|k|,eps)), eps = 1e-8
//   gaussian   exp(-|q-k|_2^2)    (ranked by -|q-k|^2, which has the same order and never underflows)
//   chebyshev  exp(-|q-k|_inf)    (ranked by -|q-k|_inf; selects the R x R window on a grid)
// Kept free of torch types so that kernels can share it.
#include <string>
#include <string_view>

namespace convnn {

enum class Similarity { Dot, ScaledDot, Cosine, Gaussian, Chebyshev };

inline constexpr double kCosineEps = 1e-8;

// Throws c10::Error naming `argument` and the allowed values when `name` is unknown.
Similarity parse_similarity(std::string_view name, std::string_view argument = "similarity");
const char* to_string(Similarity similarity);

// gaussian and chebyshev are distances turned into similarities: they rank by the negated
// distance and report exp(-distance).
inline bool is_distance_similarity(Similarity s) {
  return s == Similarity::Gaussian || s == Similarity::Chebyshev;
}

}  // namespace convnn
