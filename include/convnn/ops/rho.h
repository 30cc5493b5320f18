#pragma once
// rho, the map from a row's K selected scores to its aggregation weights. Shared by the ops
// (convnn::knn_attention takes it by name) and the layers' options. Free of torch types.
#include <string>
#include <string_view>
#include <vector>

namespace convnn {

/// Masked (-inf) slots always weigh 0. uniform: every valid slot weighs 1 (the weights sum to the
/// valid count, not to one); mean: 1 / (number of valid slots); softmax: softmax(score /
/// temperature) over the valid slots. A row without a valid slot weighs 0 everywhere.
/// Each one's rules are its policy struct in src/ops/kernels/rho.h. Values are 0 .. kRhoCount - 1.
enum class Rho { Uniform, Mean, Softmax };
inline constexpr int kRhoCount = 3;

/// Throws c10::Error naming the option ("rho") and the allowed values when `name` is unknown.
Rho parse_rho(std::string_view name);
/// The same, naming `argument` (e.g. "knn_attention: rho") in the error.
Rho parse_rho_argument(std::string_view name, const char* argument);
const char* to_string(Rho rho);
/// Every rho's name, in enum order: the one list that checks, the command line and tests read.
const std::vector<std::string>& rho_names();

/// Whether the weights depend on the score values (beyond which slots are masked), i.e. whether
/// gradients flow from the weights back to the scores.
bool rho_has_score_gradient(Rho rho);

}  // namespace convnn
