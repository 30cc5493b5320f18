#pragma once
// Each rho (the map from a row's K selected scores to its weights) is one policy struct, as each
// similarity is (similarity.h): its enum value, name, whether gradients flow back to the scores,
// whether it weighs slots at all (uniform's weights are all 1), its row rule and its cost. The row
// rules follow reference::rho_weights: -inf slots are masked and weigh exactly 0, a row with no
// valid slot weighs 0 everywhere, softmax subtracts the row's largest valid score. Host- and
// device-callable and free of torch types, in the accumulation type.
#include <c10/macros/Macros.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <c10/util/Exception.h>

#include "convnn/ops/rho.h"
#include "ops/kernels/similarity.h"

namespace convnn::kernels {

template <typename acc_t, typename scalar_t>
C10_HOST_DEVICE inline bool is_masked_score(scalar_t score) {
  return static_cast<acc_t>(score) == -std::numeric_limits<acc_t>::infinity();
}

namespace detail {

// weights[s] = 0 for masked slots, `each` for the others.
template <typename acc_t, typename scalar_t>
C10_HOST_DEVICE void fill_valid(const scalar_t* scores, int64_t k, acc_t each, scalar_t* weights) {
  for (int64_t s = 0; s < k; ++s) {
    weights[s] = static_cast<scalar_t>(is_masked_score<acc_t>(scores[s]) ? acc_t(0) : each);
  }
}

template <typename acc_t, typename scalar_t>
C10_HOST_DEVICE int64_t valid_slots(const scalar_t* scores, int64_t k) {
  int64_t valid = 0;
  for (int64_t s = 0; s < k; ++s) valid += is_masked_score<acc_t>(scores[s]) ? 0 : 1;
  return valid;
}

}  // namespace detail

/// Every valid slot weighs 1 (the weights sum to the valid count).
struct UniformRho {
  static constexpr Rho kKind = Rho::Uniform;
  static constexpr const char* kName = "uniform";
  static constexpr bool kHasScoreGradient = false;
  static constexpr bool kWeighsSlots = false;
  template <typename acc_t, typename scalar_t>
  C10_HOST_DEVICE static void weights(const scalar_t* scores, int64_t k, acc_t, scalar_t* weights) {
    detail::fill_valid<acc_t>(scores, k, acc_t(1), weights);
  }
  static constexpr OpCost cost(int64_t, int64_t, bool) { return {}; }
};

/// 1 / (number of valid slots).
struct MeanRho {
  static constexpr Rho kKind = Rho::Mean;
  static constexpr const char* kName = "mean";
  static constexpr bool kHasScoreGradient = false;
  static constexpr bool kWeighsSlots = true;
  template <typename acc_t, typename scalar_t>
  C10_HOST_DEVICE static void weights(const scalar_t* scores, int64_t k, acc_t, scalar_t* weights) {
    const int64_t valid = detail::valid_slots<acc_t>(scores, k);
    detail::fill_valid<acc_t>(scores, k, valid > 0 ? acc_t(1) / static_cast<acc_t>(valid) : acc_t(1),
                              weights);
  }
  // One reciprocal per row.
  static constexpr OpCost cost(int64_t rows, int64_t, bool) { return {0, rows, 0}; }
};

/// softmax(score / temperature) over the valid slots. The largest valid score is subtracted before
/// the division by the temperature: every exponent is then <= 0 and the largest is exactly 0, so
/// any temperature the op accepts (check_temperature) gives finite weights summing to one, down
/// to the hard max.
struct SoftmaxRho {
  static constexpr Rho kKind = Rho::Softmax;
  static constexpr const char* kName = "softmax";
  static constexpr bool kHasScoreGradient = true;
  static constexpr bool kWeighsSlots = true;
  template <typename acc_t, typename scalar_t>
  C10_HOST_DEVICE static void weights(const scalar_t* scores, int64_t k, acc_t temperature,
                                      scalar_t* weights) {
    acc_t largest = -std::numeric_limits<acc_t>::infinity();
    for (int64_t s = 0; s < k; ++s) {
      if (is_masked_score<acc_t>(scores[s])) continue;
      const acc_t score = static_cast<acc_t>(scores[s]);
      largest = score > largest ? score : largest;
    }
    if (largest == -std::numeric_limits<acc_t>::infinity()) {
      detail::fill_valid<acc_t>(scores, k, acc_t(1), weights);  // every slot masked: all weigh 0
      return;
    }
    const auto exponential = [&](int64_t s) {
      return is_masked_score<acc_t>(scores[s])
                 ? acc_t(0)
                 : std::exp((static_cast<acc_t>(scores[s]) - largest) / temperature);
    };
    acc_t total = 0;
    if constexpr (std::is_same_v<acc_t, scalar_t>) {
      // Each exponential once, kept in the output row and then divided in place: the same values
      // as below, at half the exponentials (the output type keeps them exactly).
      for (int64_t s = 0; s < k; ++s) {
        weights[s] = exponential(s);
        total += weights[s];
      }
      for (int64_t s = 0; s < k; ++s) weights[s] = weights[s] / total;
    } else {
      for (int64_t s = 0; s < k; ++s) total += exponential(s);
      for (int64_t s = 0; s < k; ++s) weights[s] = static_cast<scalar_t>(exponential(s) / total);
    }
  }
  // Subtract the max, exp, sum, divide (4 FLOPs) and the max (a comparison) per slot; a division
  // by the temperature when it is not 1.
  static constexpr OpCost cost(int64_t rows, int64_t k, bool tempered) {
    return {0, (4 + (tempered ? 1 : 0)) * rows * k, rows * k};
  }
};

/// Calls f(Policy{}) with the policy of `rho`; no default, so a new value without a policy fails
/// the build (-Werror=switch).
template <typename F>
decltype(auto) dispatch_rho(Rho rho, F&& f) {
  switch (rho) {
    case Rho::Uniform: return f(UniformRho{});
    case Rho::Mean: return f(MeanRho{});
    case Rho::Softmax: return f(SoftmaxRho{});
  }
  TORCH_INTERNAL_ASSERT(false, "dispatch_rho: no policy for rho ", static_cast<int>(rho));
}

/// weights[s] = rho(scores)[s] for s < k.
template <typename acc_t, typename scalar_t>
void rho_row(const scalar_t* scores, int64_t k, Rho rho, acc_t temperature, scalar_t* weights) {
  dispatch_rho(rho, [&](auto policy) {
    decltype(policy)::template weights<acc_t>(scores, k, temperature, weights);
  });
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

}  // namespace convnn::kernels
