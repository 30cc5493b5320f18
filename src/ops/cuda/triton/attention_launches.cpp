#include "ops/cuda/triton/attention_launches.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "ops/cuda/triton/select_launches.h"
#include "ops/cuda/triton/sorted_keys.h"
#include "ops/unit_stride_rows.h"

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

// The keys of the backward's kernels (compiled per dtype), as specialisations.py names them.
std::string scores_gradient_key(int64_t k, at::ScalarType dtype) {
  return "attention softmax scores gradient K<=" + std::to_string(top_k_slots(k)) + " " + kernel_dtype_name(dtype);
}
std::string backward_rows_key(Similarity similarity, int64_t k, at::ScalarType dtype) {
  return std::string("attention backward rows ") + to_string(similarity) + " K<=" + std::to_string(top_k_slots(k)) +
         " " + kernel_dtype_name(dtype);
}
std::string backward_columns_key(at::ScalarType dtype) {
  return std::string("attention backward columns ") + kernel_dtype_name(dtype);
}

int64_t cdiv(int64_t total, int64_t block) { return (total + block - 1) / block; }

// The shape of a per-slot tensor ([G,N,K], or [B,H,N,K] with head dims) for queries of this shape.
std::vector<int64_t> slots_shape(const at::Tensor& queries, int64_t k) {
  auto shape = queries.sizes().vec();
  shape.back() = k;
  return shape;
}

// A result of `like`'s rows, `width` wide: [G,rows,width], or for [B,H,rows,*] [B,H,rows,width]
// stored as [B,rows,H,width] (the forward's output and the backward's gradients with heads as a
// dimension: src/ops/op_signatures.h).
at::Tensor empty_rows(const at::Tensor& like, int64_t width) {
  if (like.dim() == 3) return at::empty({like.size(0), like.size(1), width}, like.options());
  return at::empty({like.size(0), like.size(2), like.size(1), width}, like.options()).transpose(1, 2);
}

}  // namespace

bool attention_fits(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
                    const at::Tensor& kernel, int64_t k) {
  constexpr int64_t kInt32 = std::numeric_limits<int32_t>::max();
  const int64_t g = slices_of(queries), n = queries.size(-2), c = values.size(-1);
  return kernel.dim() == 2 && select_fits(queries, keys, k) && values.numel() <= kInt32 &&
         g * n * std::max<int64_t>(c, 1) <= kInt32 && row_layout_fits(values);
}

const std::vector<std::string>& attention_kernel_keys(at::ScalarType dtype) {
  return keys_per_dtype(dtype, [](at::ScalarType type) { return top_k_keys("attention", type); });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_forward(
    const at::Tensor& queries_in, const at::Tensor& keys_in, const at::Tensor& values_in, const at::Tensor& kernel_in,
    const at::Tensor& bias_in, int64_t k, Similarity similarity, const at::Tensor& mask_in, bool index_order, Rho rho,
    double temperature, const LaunchRunner& run) {
  const int64_t g = slices_of(queries_in), n = queries_in.size(-2), d = queries_in.size(-1);
  const int64_t m = values_in.size(-2), c = values_in.size(-1);
  const auto dtype = queries_in.scalar_type();
  // The outputs in the op's dtype (the kernel writes them so); its inputs in top_k_input_dtype, read
  // in place wherever their rows are unit-stride (the [B,H,N,D] heads of a projection, say).
  auto output = empty_rows(queries_in, c), scores = at::empty(slots_shape(queries_in, k), queries_in.options());
  auto weights = at::empty(slots_shape(queries_in, k), queries_in.options());
  auto indices = at::empty(slots_shape(queries_in, k), queries_in.options().dtype(at::kLong));
  if (g * n > 0) {
    const auto in = ranking_operands(queries_in, keys_in, mask_in, similarity);
    const auto input = top_k_input_dtype(dtype);
    const auto values = unit_stride_rows(values_in.to(input)), kernel = kernel_in.to(input).contiguous();
    // Without a bias the kernel does not read bias_ptr (has_bias is 0); any valid pointer does.
    const auto bias = bias_in.defined() ? bias_in.to(input).contiguous() : values;
    Launch launch{top_k_key("attention", similarity, k, in.mask_kind, dtype),
                  {cdiv(n, top_k_rows(k)), g}, {}};
    launch.arguments.pointer(in.queries).pointer(in.keys).pointer(values).pointer(kernel).pointer(bias)
        .pointer(in.mask).pointer(output).pointer(scores).pointer(indices).pointer(weights)
        .int32(n).int32(m).int32(d).int32(c).int32(k).int32(in.mask_slice_stride).int32(in.slices_per_mask_slice)
        .float32(in.similarity_constant)
        .int32(rho_code(rho)).float32(static_cast<float>(temperature)).int32(index_order ? 1 : 0)
        .int32(bias_in.defined() ? 1 : 0).int32(dtype_code(dtype)).int32(heads_of(in.queries))
        .rows(row_layout(in.queries)).rows(row_layout(in.keys)).rows(row_layout(values)).rows(row_layout(output));
    run(launch);
  }
  return {output, scores, indices, weights};
}

std::string rho_aggregate_key(int64_t k, at::ScalarType dtype) {
  return "attention rho aggregate K<=" + std::to_string(top_k_slots(k)) + input_key_suffix(dtype);
}

bool rho_aggregate_fits(const at::Tensor& scores, const at::Tensor& values, const at::Tensor& kernel) {
  constexpr int64_t kInt32 = std::numeric_limits<int32_t>::max();
  constexpr int64_t kGridYZ = 65535;
  const int64_t g = scores.size(0), n = scores.size(1), k = scores.size(2), c = values.size(2);
  return kernel.dim() == 2 && k >= 1 && k <= kSelectBlocks.max_slots && g <= kGridYZ && scores.numel() <= kInt32 &&
         values.numel() <= kInt32 && g * n * std::max<int64_t>(c, 1) <= kInt32;
}

const std::vector<std::string>& rho_aggregate_kernel_keys(at::ScalarType dtype) {
  return keys_per_dtype(dtype, [](at::ScalarType type) {
    std::vector<std::string> all;
    for (const int64_t slots : top_k_slot_widths()) {
      all.push_back(rho_aggregate_key(slots, type));
    }
    return all;
  });
}

std::pair<at::Tensor, at::Tensor> rho_aggregate(const at::Tensor& scores_in, const at::Tensor& indices,
                                                const at::Tensor& values_in, const at::Tensor& kernel_in,
                                                const at::Tensor& bias_in, Rho rho, double temperature,
                                                const LaunchRunner& run) {
  const int64_t g = scores_in.size(0), n = scores_in.size(1), k = scores_in.size(2);
  const int64_t m = values_in.size(1), c = values_in.size(2);
  const auto dtype = scores_in.scalar_type();
  auto output = at::empty({g, n, c}, values_in.options()), weights = at::empty_like(scores_in);
  if (g * n == 0) return {output, weights};
  const auto input = top_k_input_dtype(dtype);
  const auto scores = scores_in.to(input).contiguous(), values = values_in.to(input).contiguous();
  const auto kernel = kernel_in.to(input).contiguous();
  // Without a bias the kernel does not read bias_ptr (has_bias is 0); any valid pointer does.
  const auto bias = bias_in.defined() ? bias_in.to(input).contiguous() : values;
  Launch launch{rho_aggregate_key(k, dtype), {cdiv(n, kAttentionCodes.rho_aggregate_rows), g}, {}};
  launch.arguments.pointer(scores).pointer(indices.contiguous()).pointer(values).pointer(kernel).pointer(bias)
      .pointer(output).pointer(weights).int32(n).int32(m).int32(c).int32(k).int32(rho_code(rho))
      .float32(static_cast<float>(temperature)).int32(bias_in.defined() ? 1 : 0).int32(dtype_code(dtype));
  run(launch);
  return {output, weights};
}

bool scores_gradient_fits(const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
                          const at::Tensor& kernel) {
  constexpr int64_t kInt32 = std::numeric_limits<int32_t>::max();
  const int64_t k = weights.size(2);
  return kernel.dim() == 2 && k >= 1 && k <= kSelectBlocks.max_slots && grad_output.numel() <= kInt32 &&
         values.numel() <= kInt32 && weights.numel() <= kInt32 && values.size(0) * values.size(1) <= kInt32 &&
         row_layout_fits(grad_output) && row_layout_fits(values);
}

const std::vector<std::string>& scores_gradient_kernel_keys(at::ScalarType dtype) {
  return keys_per_dtype(dtype, [](at::ScalarType type) {
    std::vector<std::string> all;
    for (const int64_t slots : top_k_slot_widths()) {
      all.push_back(scores_gradient_key(slots, type));
    }
    return all;
  });
}

at::Tensor softmax_scores_gradient(const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
                                   const at::Tensor& indices, const at::Tensor& kernel, double temperature,
                                   const LaunchRunner& run) {
  const int64_t g = weights.size(0), n = weights.size(1), k = weights.size(2);
  const int64_t m = values.size(1), c = values.size(2);
  const auto dtype = values.scalar_type();
  // The kernel reads the inputs and writes d scores in the op's dtype (one compiled per dtype).
  auto grad_scores = at::empty({g, n, k}, weights.options());
  if (grad_scores.numel() == 0) return grad_scores;
  Launch launch{scores_gradient_key(k, dtype), {(g * n + kSelectBlocks.rows - 1) / kSelectBlocks.rows}, {}};
  launch.arguments.pointer(grad_output).pointer(values).pointer(kernel).pointer(indices).pointer(weights)
      .pointer(grad_scores).int32(g * n).int32(n).int32(m).int32(c).int32(k).float32(static_cast<float>(temperature))
      .int32(heads_of(values)).rows(row_layout(grad_output)).rows(row_layout(values));
  run(launch);
  return grad_scores;
}

bool attention_backward_fits(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
                             const at::Tensor& kernel, const at::Tensor& scores, Similarity similarity, Rho rho) {
  constexpr int64_t kInt32 = std::numeric_limits<int32_t>::max();
  const int64_t g = slices_of(queries), n = queries.size(-2), d = queries.size(-1);
  const int64_t m = keys.size(-2), c = values.size(-1), k = scores.size(-1);
  const int64_t row_blocks = cdiv(g * n, kAttentionBackwardBlocks.row_rows);
  return kernel.dim() == 2 && rho == Rho::Softmax && is_dot_product(similarity) && k >= 1 &&
         k <= kSelectBlocks.max_slots &&
         std::min({g * n, g * m, c, d}) > 0 && g * n * std::max({c, d, k}) < kInt32 &&
         g * m * std::max(c, d) < kInt32 && row_blocks * c * k < kInt32 && row_layout_fits(queries) &&
         row_layout_fits(keys) && row_layout_fits(values);
}

const std::vector<std::string>& attention_backward_kernel_keys(at::ScalarType dtype) {
  return keys_per_dtype(dtype, [](at::ScalarType type) {
    std::vector<std::string> all{backward_columns_key(type)};
    for (const auto similarity : {Similarity::Dot, Similarity::ScaledDot}) {
      for (const int64_t slots : top_k_slot_widths()) {
        all.push_back(backward_rows_key(similarity, slots, type));
      }
    }
    return all;
  });
}

at::Tensor busiest_first(const at::Tensor& run_start, int64_t longest) {
  const int64_t rows = run_start.size(0) - 1;
  // The run lengths (int32, as run_start), sorted over the bits that hold `longest` alone (sorted_keys.h).
  const auto lengths = run_start.slice(0, 1) - run_start.slice(0, 0, rows);
  return sorted_keys(lengths, bits_for(longest), /*descending=*/true).positions;
}

std::vector<at::Tensor> attention_backward(const at::Tensor& grad_output, const at::Tensor& queries,
                                           const at::Tensor& keys, const at::Tensor& values, const at::Tensor& kernel,
                                           const at::Tensor& scores, const at::Tensor& indices,
                                           const at::Tensor& weights, Similarity similarity, double temperature,
                                           const LaunchRunner& run) {
  const int64_t g = slices_of(queries), n = queries.size(-2), d = queries.size(-1);
  const int64_t m = values.size(-2), c = values.size(-1), k = indices.size(-1);
  // The kernels read the inputs (in place wherever their rows are unit-stride: the [B,H,N,D] heads
  // of a projection, say) and write the three gradients (empty_rows: of their inputs' shapes) in the
  // op's dtype (one compiled per dtype); the score gradient (live) and the kernel's partials are
  // float32. Scores, indices and weights are contiguous, as the forward wrote them.
  const auto dtype = queries.scalar_type();
  const auto float_options = queries.options().dtype(at::kFloat);
  const int64_t row_blocks = cdiv(g * n, kAttentionBackwardBlocks.row_rows);
  const int64_t heads = heads_of(queries);
  auto live = at::empty({g, n, k}, float_options), grad_queries = empty_rows(queries, d);
  auto partial = at::empty({row_blocks, c, k}, float_options);
  // sqrt(D) correctly rounded to float32, as the select backward divides by it.
  const float root = std::sqrt(static_cast<float>(d));
  Launch rows{backward_rows_key(similarity, k, dtype), {row_blocks}, {}};
  rows.arguments.pointer(grad_output).pointer(values).pointer(kernel).pointer(indices).pointer(weights)
      .pointer(scores).pointer(keys).pointer(live).pointer(grad_queries).pointer(partial)
      .int32(g * n).int32(n).int32(m).int32(c).int32(d).int32(k).float32(static_cast<float>(temperature))
      .float32(root).int32(heads).rows(row_layout(grad_output)).rows(row_layout(keys)).rows(row_layout(values))
      .rows(row_layout(grad_queries));
  run(rows);
  const auto [order, run_start] = inverse_index(indices.view({g, n, k}), m);
  const auto row_order = busiest_first(run_start, n * k);  // a run: some of its slice's N*K slots
  auto grad_keys = empty_rows(keys, d), grad_values = empty_rows(values, c);
  const int64_t width = kAttentionBackwardBlocks.column_width;
  const int64_t value_parts = cdiv(c, width);
  // The column kernel reads a slot's taps for a block of channels as one row's chunk: [K, C].
  const auto taps = kernel.t().contiguous();
  Launch columns{backward_columns_key(dtype),
                 {cdiv(g * m, kAttentionBackwardBlocks.column_rows), value_parts + cdiv(d, width)}, {}};
  columns.arguments.pointer(grad_output).pointer(queries).pointer(weights).pointer(taps).pointer(live)
      .pointer(order).pointer(run_start).pointer(row_order).pointer(grad_values).pointer(grad_keys).int32(g * m)
      .int32(c).int32(d).int32(k).int32(value_parts).int32(n).int32(m).int32(heads).rows(row_layout(grad_output))
      .rows(row_layout(queries)).rows(row_layout(grad_values)).rows(row_layout(grad_keys));
  run(columns);
  std::vector<int64_t> rows_dims(static_cast<size_t>(grad_output.dim() - 1));
  std::iota(rows_dims.begin(), rows_dims.end(), int64_t{0});
  return {grad_queries, grad_keys, grad_values, partial.sum(0).to(kernel.scalar_type()), grad_output.sum(rows_dims)};
}

}  // namespace convnn::ops::cuda::triton
