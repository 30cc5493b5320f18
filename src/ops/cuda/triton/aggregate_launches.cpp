#include "ops/cuda/triton/aggregate_launches.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "ops/cuda/triton/sorted_keys.h"

namespace convnn::ops::cuda::triton {
namespace {

// The specialisation keys, as scripts/triton_compile_check.py names them.
std::string key(const char* kind, bool standard, at::ScalarType dtype, bool with_bias = false) {
  return std::string(standard ? "standard " : "") + kind + " " + kernel_dtype_name(dtype) + (with_bias ? " bias" : "");
}

int64_t blocks(int64_t total, int64_t block) { return std::max<int64_t>(1, (total + block - 1) / block); }

const char* const kKinds[] = {"forward", "d weights", "d kernel", "d values"};

}  // namespace

bool aggregate_fits(const at::Tensor& values, const at::Tensor& weights, const at::Tensor& kernel) {
  constexpr int64_t kInt32 = std::numeric_limits<int32_t>::max();
  constexpr int64_t kGridYZ = 65535;
  const int64_t widest = std::max(values.size(2), kernel.size(0));
  const int64_t k = weights.size(2);
  // The largest grids: (G*M, C/CHANNELS) for the values' gradient, (C'/CHANNELS, C/CHANNELS,
  // chunks*K) for the standard kernel's.
  return values.numel() <= kInt32 && weights.numel() <= kInt32 &&
         kernel.numel() <= kInt32 && values.size(0) * values.size(1) <= kInt32 &&
         values.size(0) * weights.size(1) * std::max<int64_t>(widest, 1) <= kInt32 &&
         blocks(widest, kAggregateBlocks.channels) <= kGridYZ && k * kAggregateBlocks.kernel_gradient_chunks <= kGridYZ;
}

const char* kernel_dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: TORCH_INTERNAL_ASSERT(false, "the Triton kernels take float32, bfloat16 or float16, not ", dtype);
  }
}

const std::vector<std::string>& aggregate_kernel_keys(at::ScalarType dtype) {
  return keys_per_dtype(dtype, [](at::ScalarType type) {
    std::vector<std::string> keys;
    for (const bool standard : {false, true}) {
      for (const char* kind : kKinds) keys.push_back(key(kind, standard, type));
    }
    return keys;
  });
}

at::Tensor aggregate_forward(const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
                             const at::Tensor& kernel, const at::Tensor& bias, const LaunchRunner& run) {
  const int64_t g = values.size(0), m = values.size(1), c = values.size(2);
  const int64_t n = weights.size(1), k = weights.size(2);
  const bool standard = kernel.dim() == 3;
  const int64_t c_out = standard ? kernel.size(0) : c;
  auto output = at::empty({g, n, c_out}, values.options());
  if (output.numel() == 0 || c == 0) {
    return bias.defined() ? output.copy_(bias.expand_as(output)) : output.zero_();
  }
  Launch launch{key("forward", standard, values.scalar_type(), bias.defined()),
                {blocks(g * n, kAggregateBlocks.rows), blocks(c_out, kAggregateBlocks.channels)},
                {}};
  // Without a bias the kernel does not read bias_ptr (HAS_BIAS is false); any valid pointer does.
  launch.arguments.pointer(values).pointer(weights).pointer(indices).pointer(kernel)
      .pointer(bias.defined() ? bias : values).pointer(output)
      .int32(g * n).int32(n).int32(m).int32(c);
  if (standard) launch.arguments.int32(c_out);
  launch.arguments.int32(k);
  run(launch);
  return output;
}

std::pair<at::Tensor, at::Tensor> inverse_index(const at::Tensor& indices, int64_t m) {
  const int64_t g = indices.size(0);
  // The targets in 32 bits (every launcher's fits rule bounds G*M below 2^31), sorted over the bits
  // that hold G*M - 1 alone (sorted_keys.h).
  const auto target = (indices + at::arange(g, indices.options()).view({g, 1, 1}) * m).reshape(-1).to(at::kInt);
  const auto sorted = sorted_keys(target, bits_for(std::max<int64_t>(g * m - 1, 0)), /*descending=*/false);
  // From the sorted targets by searchsorted: a bincount would read its input's maximum back to the
  // host, which a CUDA graph cannot capture.
  const auto rows = at::arange(g * m + 1, sorted.keys.options());
  return {sorted.positions, at::searchsorted(sorted.keys, rows, /*out_int32=*/true)};
}

namespace {

at::Tensor kernel_gradient(const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
                           const at::Tensor& indices, const at::Tensor& kernel, const LaunchRunner& run) {
  const int64_t g = values.size(0), m = values.size(1), c = values.size(2);
  const int64_t n = weights.size(1), k = weights.size(2), rows_total = g * n;
  if (kernel.numel() == 0 || rows_total == 0) return at::zeros_like(kernel);
  const int64_t rows = kAggregateBlocks.rows, channels = kAggregateBlocks.channels;
  // Per-chunk partial sums in float32, then their sum over chunks in a fixed order (no atomics).
  const int64_t rows_per_chunk = blocks(blocks(rows_total, kAggregateBlocks.kernel_gradient_chunks), rows) * rows;
  const int64_t chunks = blocks(rows_total, rows_per_chunk);
  std::vector<int64_t> partial_shape{chunks};
  partial_shape.insert(partial_shape.end(), kernel.sizes().begin(), kernel.sizes().end());
  auto partial = at::empty(partial_shape, values.options().dtype(at::kFloat));
  const bool standard = kernel.dim() == 3;
  const int64_t c_out = standard ? kernel.size(0) : c;
  Launch launch{key("d kernel", standard, values.scalar_type()),
                standard ? Grid{blocks(c_out, channels), blocks(c, channels), chunks * k}
                         : Grid{blocks(c, channels), k, chunks},
                {}};
  launch.arguments.pointer(grad_output).pointer(values).pointer(weights).pointer(indices).pointer(partial)
      .int32(rows_total).int32(n).int32(m).int32(c);
  if (standard) launch.arguments.int32(c_out);
  launch.arguments.int32(k).int32(rows_per_chunk);
  run(launch);
  return partial.sum(0).to(kernel.scalar_type());
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> aggregate_backward(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
    const at::Tensor& kernel, std::array<bool, 4> output_mask, const LaunchRunner& run) {
  const auto [want_values, want_weights, want_kernel, want_bias] = output_mask;
  const int64_t g = values.size(0), m = values.size(1), c = values.size(2);
  const int64_t n = weights.size(1), k = weights.size(2), rows_total = g * n;
  const bool standard = kernel.dim() == 3;
  const int64_t c_out = standard ? kernel.size(0) : c;
  const auto dtype = values.scalar_type();
  at::Tensor grad_values, grad_weights, grad_kernel, grad_bias;
  if (want_values) {
    grad_values = at::empty_like(values);
    if (grad_values.numel() > 0) {
      const auto [order, run_start] = inverse_index(indices, m);
      Launch launch{key("d values", standard, dtype), {g * m, blocks(c, kAggregateBlocks.channels)}, {}};
      launch.arguments.pointer(grad_output).pointer(weights).pointer(kernel).pointer(order).pointer(run_start)
          .pointer(grad_values).int32(c);
      if (standard) launch.arguments.int32(c_out);
      launch.arguments.int32(k);
      run(launch);
    }
  }
  if (want_weights) {
    grad_weights = at::zeros_like(weights);
    if (grad_weights.numel() > 0 && c > 0 && c_out > 0) {
      Launch launch{key("d weights", standard, dtype), {blocks(rows_total, kAggregateBlocks.rows), k}, {}};
      launch.arguments.pointer(grad_output).pointer(values).pointer(indices).pointer(kernel).pointer(grad_weights)
          .int32(rows_total).int32(n).int32(m).int32(c);
      if (standard) launch.arguments.int32(c_out);
      launch.arguments.int32(k);
      run(launch);
    }
  }
  if (want_kernel) grad_kernel = kernel_gradient(grad_output, values, weights, indices, kernel, run);
  if (want_bias) grad_bias = grad_output.sum(std::vector<int64_t>{0, 1});
  return {grad_values, grad_weights, grad_kernel, grad_bias};
}

}  // namespace convnn::ops::cuda::triton
