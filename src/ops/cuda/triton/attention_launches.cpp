#include "ops/cuda/triton/attention_launches.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "ops/cuda/triton/select_launches.h"

namespace convnn::ops::cuda::triton {
namespace {

int rho_code(Rho rho) {
  switch (rho) {
    case Rho::Uniform: return kAttentionCodes.uniform;
    case Rho::Mean: return kAttentionCodes.mean;
    case Rho::Softmax: return kAttentionCodes.softmax;
  }
  TORCH_INTERNAL_ASSERT(false, "attention_forward: unknown rho ", static_cast<int>(rho));
}

int dtype_code(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return kAttentionCodes.float32;
    case at::kBFloat16: return kAttentionCodes.bfloat16;
    case at::kHalf: return kAttentionCodes.float16;
    default: TORCH_INTERNAL_ASSERT(false, "attention_forward: no fused kernel for ", dtype);
  }
}

std::string scores_gradient_key(int64_t k) {
  return "attention softmax scores gradient K<=" + std::to_string(top_k_slots(k));
}

}  // namespace

bool attention_fits(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
                    const at::Tensor& kernel, int64_t k) {
  constexpr int64_t kInt32 = std::numeric_limits<int32_t>::max();
  const int64_t g = queries.size(0), n = queries.size(1), c = values.size(2);
  return kernel.dim() == 2 && select_fits(queries, keys, k) && values.numel() <= kInt32 &&
         g * n * std::max<int64_t>(c, 1) <= kInt32;
}

bool device_has_attention_kernels(int device) {
  static const std::vector<std::string> keys = top_k_keys("attention");
  return device_has_kernels(device, "attention", keys);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_forward(
    const at::Tensor& queries_in, const at::Tensor& keys_in, const at::Tensor& values_in, const at::Tensor& kernel_in,
    const at::Tensor& bias_in, int64_t k, Similarity similarity, const at::Tensor& mask_in, bool index_order, Rho rho,
    double temperature, const LaunchRunner& run) {
  const int64_t g = queries_in.size(0), n = queries_in.size(1), d = queries_in.size(2);
  const int64_t m = values_in.size(1), c = values_in.size(2);
  const auto dtype = queries_in.scalar_type();
  const auto as_float = queries_in.options().dtype(at::kFloat);
  auto output = at::empty({g, n, c}, as_float), scores = at::empty({g, n, k}, as_float);
  auto weights = at::empty({g, n, k}, as_float);
  auto indices = at::empty({g, n, k}, queries_in.options().dtype(at::kLong));
  if (g * n > 0) {
    const auto in = ranking_operands(queries_in, keys_in, mask_in, similarity);
    const auto values = values_in.to(at::kFloat).contiguous(), kernel = kernel_in.to(at::kFloat).contiguous();
    // Without a bias the kernel does not read bias_ptr (has_bias is 0); any valid pointer does.
    const auto bias = bias_in.defined() ? bias_in.to(at::kFloat).contiguous() : values;
    Launch launch{top_k_key("attention", similarity, k, in.mask_kind),
                  {(n + kSelectBlocks.rows - 1) / kSelectBlocks.rows, g}, {}};
    launch.arguments.pointer(in.queries).pointer(in.keys).pointer(values).pointer(kernel).pointer(bias)
        .pointer(in.mask).pointer(output).pointer(scores).pointer(indices).pointer(weights)
        .int32(n).int32(m).int32(d).int32(c).int32(k).int32(in.mask_slice_stride).float32(in.root)
        .int32(rho_code(rho)).float32(static_cast<float>(temperature)).int32(index_order ? 1 : 0)
        .int32(bias_in.defined() ? 1 : 0).int32(dtype_code(dtype));
    run(launch);
  }
  return {output.to(dtype), scores.to(dtype), indices, weights.to(dtype)};
}

bool scores_gradient_fits(const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
                          const at::Tensor& kernel) {
  constexpr int64_t kInt32 = std::numeric_limits<int32_t>::max();
  const int64_t k = weights.size(2);
  return kernel.dim() == 2 && k >= 1 && k <= kSelectBlocks.max_slots && grad_output.numel() <= kInt32 &&
         values.numel() <= kInt32 && weights.numel() <= kInt32 && values.size(0) * values.size(1) <= kInt32;
}

bool device_has_scores_gradient_kernels(int device) {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> all;
    for (int64_t slots = kSelectBlocks.min_slots; slots <= kSelectBlocks.max_slots; slots *= 2) {
      all.push_back(scores_gradient_key(slots));
    }
    return all;
  }();
  return device_has_kernels(device, "attention softmax scores gradient", keys);
}

at::Tensor softmax_scores_gradient(const at::Tensor& grad_output, const at::Tensor& values_in, const at::Tensor& weights,
                                   const at::Tensor& indices, const at::Tensor& kernel, double temperature,
                                   const LaunchRunner& run) {
  const int64_t g = weights.size(0), n = weights.size(1), k = weights.size(2);
  const int64_t m = values_in.size(1), c = values_in.size(2);
  const auto dtype = values_in.scalar_type();
  auto grad_scores = at::empty({g, n, k}, weights.options().dtype(at::kFloat));
  if (grad_scores.numel() == 0) return grad_scores.to(dtype);
  const auto as_float = [](const at::Tensor& t) { return t.to(at::kFloat).contiguous(); };
  const auto dy = as_float(grad_output), values = as_float(values_in), taps = as_float(kernel), w = as_float(weights);
  Launch launch{scores_gradient_key(k), {(g * n + kSelectBlocks.rows - 1) / kSelectBlocks.rows}, {}};
  launch.arguments.pointer(dy).pointer(values).pointer(taps).pointer(indices).pointer(w).pointer(grad_scores)
      .int32(g * n).int32(n).int32(m).int32(c).int32(k).float32(static_cast<float>(temperature))
      .int32(dtype_code(dtype));
  run(launch);
  return grad_scores.to(dtype);
}

}  // namespace convnn::ops::cuda::triton
