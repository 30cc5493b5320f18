#pragma once
// rho on one row of K selected scores, and its backward, in the accumulation type. The same
// semantics as the reference (reference::rho_weights): -inf slots are masked and weigh exactly 0,
// a row with no valid slot weighs 0 everywhere, softmax subtracts the row's largest valid score.
// Header-only and free of torch types, so that a CUDA twin can share it.
#include <c10/macros/Macros.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "convnn/ops/rho.h"

namespace convnn::cpu {

template <typename acc_t, typename scalar_t>
C10_HOST_DEVICE inline bool is_masked_score(scalar_t score) {
  return static_cast<acc_t>(score) == -std::numeric_limits<acc_t>::infinity();
}

// weights[s] = rho(scores)[s] for s < k. Softmax subtracts the largest valid score before dividing
// by the temperature: every exponent is then <= 0 and the largest is exactly 0, so any temperature
// the op accepts (check_temperature) gives finite weights summing to one, down to the hard max.
template <typename acc_t, typename scalar_t>
C10_HOST_DEVICE void rho_row(const scalar_t* scores, int64_t k, Rho rho, acc_t temperature,
                             scalar_t* weights) {
  int64_t valid = 0;
  acc_t largest = -std::numeric_limits<acc_t>::infinity();
  for (int64_t s = 0; s < k; ++s) {
    if (is_masked_score<acc_t>(scores[s])) continue;
    ++valid;
    const acc_t score = static_cast<acc_t>(scores[s]);
    largest = score > largest ? score : largest;
  }
  if (rho != Rho::Softmax || valid == 0) {
    // A softmax row without a valid slot lands here too: every slot is masked and weighs 0.
    const acc_t each = rho == Rho::Mean && valid > 0 ? acc_t(1) / static_cast<acc_t>(valid) : acc_t(1);
    for (int64_t s = 0; s < k; ++s) {
      weights[s] = static_cast<scalar_t>(is_masked_score<acc_t>(scores[s]) ? acc_t(0) : each);
    }
    return;
  }
  const auto exponential = [&](int64_t s) {
    return is_masked_score<acc_t>(scores[s])
               ? acc_t(0)
               : std::exp((static_cast<acc_t>(scores[s]) - largest) / temperature);
  };
  acc_t total = 0;
  for (int64_t s = 0; s < k; ++s) total += exponential(s);
  for (int64_t s = 0; s < k; ++s) weights[s] = static_cast<scalar_t>(exponential(s) / total);
}

// d(scores) of softmax rho from d(weights): w_s (g_s - sum_t w_t g_t) / temperature. Masked slots
// have w = 0 and get 0. Only softmax has a score gradient (rho_has_score_gradient).
template <typename acc_t, typename scalar_t>
C10_HOST_DEVICE void softmax_rho_backward_row(const scalar_t* weights, const scalar_t* grad_weights,
                                              int64_t k, acc_t temperature,
                                              scalar_t* grad_scores) {
  acc_t weighted = 0;
  for (int64_t s = 0; s < k; ++s) {
    weighted += static_cast<acc_t>(weights[s]) * static_cast<acc_t>(grad_weights[s]);
  }
  for (int64_t s = 0; s < k; ++s) {
    const acc_t w = static_cast<acc_t>(weights[s]);
    grad_scores[s] =
        static_cast<scalar_t>(w * (static_cast<acc_t>(grad_weights[s]) - weighted) / temperature);
  }
}

}  // namespace convnn::cpu
