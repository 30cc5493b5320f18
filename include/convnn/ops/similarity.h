#pragma once
// Similarity functions of knn_select. Larger always means more similar.
//   dot        q.k
//   scaled_dot q.k / sqrt(D)
//   cosine     q.k / (max(|q|,eps) max(|k|,eps)), eps = 1e-8
//   gaussian   exp(-|q-k|_2^2)    (ranked by -|q-k|^2, which has the same order and never underflows)
//   chebyshev  exp(-|q-k|_inf)    (ranked by -|q-k|_inf; selects the R x R window on a grid)
//   l1         exp(-|q-k|_1)      (ranked by -|q-k|_1)
// Each one's rules (ranking key, reported score, gradient, cost) are its policy struct in
// src/ops/kernels/similarity.h. Kept free of torch types so that kernels can share it.
#include <string>
#include <string_view>
#include <vector>

namespace convnn {

/// Values are 0 .. kSimilarityCount - 1, in this order.
enum class Similarity { Dot, ScaledDot, Cosine, Gaussian, Chebyshev, L1 };
inline constexpr int kSimilarityCount = 6;

inline constexpr double kCosineEps = 1e-8;

// Throws c10::Error naming `argument` and the allowed values when `name` is unknown.
Similarity parse_similarity(std::string_view name, std::string_view argument = "similarity");
const char* to_string(Similarity similarity);

/// Every similarity's name, in enum order: the one list that checks, the command line and the
/// tests read.
const std::vector<std::string>& similarity_names();

/// The distances turned into similarities (gaussian, chebyshev, l1) rank by the negated distance
/// and report exp(-distance).
bool is_distance_similarity(Similarity similarity);

}  // namespace convnn
