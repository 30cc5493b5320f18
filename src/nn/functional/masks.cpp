#include <ATen/ATen.h>

#include "convnn/nn/functional/convnn.h"
#include "nn/functional/symint_forms.h"

namespace convnn::nn::functional {
namespace {

// Row index i and column index j of an [n,n] grid.
std::pair<at::Tensor, at::Tensor> row_col(int64_t n, const at::Device& device) {
  const auto i = at::arange(n, at::TensorOptions().dtype(at::kLong).device(device));
  return {i.view({n, 1}), i.view({1, n})};
}

}  // namespace

at::Tensor causal_mask(int64_t n, const at::Device& device) {
  TORCH_CHECK(n >= 0, "causal_mask: n must be non-negative, got ", n);
  return detail::causal_mask_symint(n, device);
}

namespace detail {

// The token count as a Scalar, which holds a SymInt under tracing (row_col's view({n, 1}) would
// need a concrete n).
at::Tensor causal_mask_symint(const c10::SymInt& n, const at::Device& device) {
  const auto i = at::arange(c10::Scalar(n), at::TensorOptions().dtype(at::kLong).device(device));
  return i.unsqueeze(0) <= i.unsqueeze(1);  // [r, c] = (c <= r)
}

}  // namespace detail

at::Tensor bigbird_mask(int64_t n, int64_t window, int64_t num_global, int64_t num_random,
                        c10::optional<at::Generator> generator, const at::Device& device) {
  TORCH_CHECK(n >= 0, "bigbird_mask: n must be non-negative, got ", n);
  TORCH_CHECK(window >= 0, "bigbird_mask: window must be non-negative, got ", window);
  TORCH_CHECK(num_global >= 0 && num_global <= n, "bigbird_mask: num_global must be in [0, n = ",
              n, "], got ", num_global);
  TORCH_CHECK(num_random >= 0 && num_random <= n, "bigbird_mask: num_random must be in [0, n = ",
              n, "], got ", num_random);
  const auto [i, j] = row_col(n, device);
  auto mask = ((i - j).abs() <= window) | (i < num_global) | (j < num_global);
  if (num_random > 0) {
    // Each row's random columns: the first num_random of an independent permutation.
    auto random = at::zeros({n, n}, at::kBool);
    for (int64_t row = 0; row < n; ++row) {
      auto cols = at::randperm(n, generator, at::TensorOptions().dtype(at::kLong)).narrow(0, 0, num_random);
      random[row].index_fill_(0, cols, true);
    }
    mask = mask | random.to(device);
  }
  return mask;
}

at::Tensor strided_mask(int64_t n, int64_t stride, bool causal, const at::Device& device) {
  TORCH_CHECK(n >= 0, "strided_mask: n must be non-negative, got ", n);
  TORCH_CHECK(stride >= 1, "strided_mask: stride must be at least 1, got ", stride);
  const auto [i, j] = row_col(n, device);
  const auto offset = i - j;
  auto mask = (offset.abs() < stride) | (offset.remainder(stride) == 0);
  return causal ? mask & (j <= i) : mask;
}

}  // namespace convnn::nn::functional
