#include "ops/checks.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <limits>
#include <string>

namespace convnn::checks {

std::string shape_string(const at::Tensor& t) {
  return fmt::format("[{}]", fmt::join(t.sizes(), ", "));
}

namespace {

void check_rank(const at::Tensor& t, int64_t rank, std::string_view op, std::string_view name,
                std::string_view layout) {
  TORCH_CHECK(t.defined(), op, ": ", name, " must be a defined tensor");
  TORCH_CHECK(t.dim() == rank, op, ": ", name, " must be ", rank, "-D ", layout, ", got shape ",
              shape_string(t));
}

void check_same_device(const at::Tensor& a, const at::Tensor& b, std::string_view op,
                       std::string_view name_a, std::string_view name_b) {
  TORCH_CHECK(a.device() == b.device(), op, ": ", name_a, " and ", name_b,
              " must be on the same device, got ", a.device(), " and ", b.device());
}

void check_same_dtype(const at::Tensor& a, const at::Tensor& b, std::string_view op,
                      std::string_view name_a, std::string_view name_b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), op, ": ", name_a, " and ", name_b,
              " must have the same dtype, got ", a.scalar_type(), " and ", b.scalar_type());
}

void check_floating(const at::Tensor& t, std::string_view op, std::string_view name) {
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), op, ": ", name,
              " must be a floating-point tensor (float64, float32, bfloat16 or float16), got ",
              t.scalar_type());
}

void check_mask(const at::Tensor& mask, const at::Tensor& queries, const at::Tensor& keys,
                Similarity similarity, std::string_view op) {
  const int64_t g = queries.size(0), n = queries.size(1), m = keys.size(1);
  TORCH_CHECK(mask.dim() == 2 || mask.dim() == 3, op,
              ": mask must be 2-D [N,M] or 3-D [G,N,M], got shape ", shape_string(mask));
  const bool shape_ok = mask.dim() == 2
                            ? (mask.size(0) == n && mask.size(1) == m)
                            : (mask.size(0) == g && mask.size(1) == n && mask.size(2) == m);
  TORCH_CHECK(shape_ok, op, ": mask shape ", shape_string(mask), " does not match [N,M] = [", n,
              ", ", m, "] or [G,N,M] = [", g, ", ", n, ", ", m, "]");
  check_same_device(mask, queries, op, "mask", "queries");
  if (mask.scalar_type() == at::kBool) return;
  TORCH_CHECK(at::isFloatingType(mask.scalar_type()), op,
              ": mask must be bool (true = may be selected) or floating-point (additive), got ",
              mask.scalar_type());
  if (is_distance_similarity(similarity) && mask.numel() > 0 && !mask.is_meta()) {
    // The ranking key of a distance similarity is -distance, not exp(-distance): an additive
    // mask is only equivalent in both domains when it holds 0 and -inf alone.
    const bool binary = ((mask == 0) | at::isneginf(mask)).all().item<bool>();
    TORCH_CHECK(binary, op, ": an additive mask with similarity '", to_string(similarity),
                "' must hold only 0 and -inf (use a bool mask); it holds other values");
  }
}

// A tensor saved from the forward ([G,N,k] scores, weights, or their gradient): defined, with the
// shape of `indices` and the dtype and device of `like`.
void check_like_slots(const at::Tensor& t, const at::Tensor& indices, const at::Tensor& like,
                      std::string_view op, std::string_view name) {
  TORCH_CHECK(t.defined(), op, ": ", name, " must be a defined tensor");
  TORCH_CHECK(t.sizes() == indices.sizes(), op, ": ", name, " must have the shape of indices ",
              shape_string(indices), ", got ", shape_string(t));
  check_same_dtype(t, like, op, name, "queries");
  check_same_device(t, like, op, name, "queries");
}

// indices [G,N,k] int64 of the queries' G and N, as the forward returned them.
void check_slot_indices(const at::Tensor& indices, const at::Tensor& queries, std::string_view op) {
  check_rank(indices, 3, op, "indices", "[G,N,k]");
  TORCH_CHECK(indices.scalar_type() == at::kLong, op, ": indices must be int64, got ",
              indices.scalar_type());
  check_rank(queries, 3, op, "queries", "[G,N,D]");
  TORCH_CHECK(indices.size(0) == queries.size(0) && indices.size(1) == queries.size(1), op,
              ": indices ", shape_string(indices), " must be [G,N,k] for queries ",
              shape_string(queries));
}

}  // namespace

Similarity check_select_inputs(const at::Tensor& queries, const at::Tensor& keys, int64_t k,
                               std::string_view similarity_name,
                               const c10::optional<at::Tensor>& mask, std::string_view op) {
  const Similarity similarity =
      parse_similarity(similarity_name, std::string(op) + ": similarity");
  check_rank(queries, 3, op, "queries", "[G,N,D]");
  check_rank(keys, 3, op, "keys", "[G,M,D]");
  check_floating(queries, op, "queries");
  check_same_dtype(queries, keys, op, "queries", "keys");
  check_same_device(queries, keys, op, "queries", "keys");
  TORCH_CHECK(queries.size(0) == keys.size(0), op, ": queries and keys must have the same G (dim 0), got queries ",
              shape_string(queries), " and keys ", shape_string(keys));
  TORCH_CHECK(queries.size(2) == keys.size(2), op, ": queries and keys must have the same feature size D (dim 2), got queries ",
              shape_string(queries), " and keys ", shape_string(keys));
  TORCH_CHECK(queries.size(2) >= 1, op, ": the feature size D must be at least 1, got queries ",
              shape_string(queries));
  const int64_t m = keys.size(1);
  TORCH_CHECK(k >= 1 && k <= m, op, ": k must be in [1, M] where M = ", m,
              " is the number of candidates (keys.size(1)), got k = ", k);
  if (mask.has_value() && mask->defined()) check_mask(*mask, queries, keys, similarity, op);
  check_finite(queries, op, "queries");
  check_finite(keys, op, "keys");
  return similarity;
}

void check_aggregate_inputs(const at::Tensor& values, const at::Tensor& weights,
                            const at::Tensor& indices, const at::Tensor& kernel,
                            const c10::optional<at::Tensor>& bias, std::string_view op) {
  check_rank(values, 3, op, "values", "[G,M,C]");
  check_rank(weights, 3, op, "weights", "[G,N,K]");
  check_rank(indices, 3, op, "indices", "[G,N,K]");
  check_same_dtype(values, weights, op, "values", "weights");
  check_same_device(values, weights, op, "values", "weights");
  check_same_device(values, indices, op, "values", "indices");
  TORCH_CHECK(indices.scalar_type() == at::kLong, op, ": indices must be int64, got ",
              indices.scalar_type());
  TORCH_CHECK(weights.sizes() == indices.sizes(), op,
              ": weights and indices must have the same shape [G,N,K], got weights ",
              shape_string(weights), " and indices ", shape_string(indices));
  TORCH_CHECK(values.size(0) == weights.size(0), op,
              ": values and weights must have the same G (dim 0), got values ",
              shape_string(values), " and weights ", shape_string(weights));
  const int64_t k = weights.size(2);
  TORCH_CHECK(k >= 1, op, ": the neighbour count K (weights.size(2)) must be at least 1, got ", k);
  check_kernel_and_bias(values, k, "weights.size(2)", kernel, bias, op);
  check_indices_in_range(indices, values.size(1), op, "indices");
}

void check_kernel_and_bias(const at::Tensor& values, int64_t k, std::string_view k_source,
                           const at::Tensor& kernel, const c10::optional<at::Tensor>& bias,
                           std::string_view op) {
  check_rank(values, 3, op, "values", "[G,M,C]");
  check_floating(values, op, "values");
  TORCH_CHECK(kernel.defined() && (kernel.dim() == 2 || kernel.dim() == 3), op,
              ": kernel must be 2-D [C,K] (depthwise) or 3-D [C',C,K] (standard), got shape ",
              kernel.defined() ? shape_string(kernel) : std::string("undefined"));
  check_same_dtype(values, kernel, op, "values", "kernel");
  check_same_device(values, kernel, op, "values", "kernel");
  const int64_t c = values.size(2);
  const int64_t kernel_c = kernel.dim() == 2 ? kernel.size(0) : kernel.size(1);
  TORCH_CHECK(kernel_c == c && kernel.size(-1) == k, op, ": kernel shape ", shape_string(kernel),
              " does not match C = ", c, " (values.size(2)) and K = ", k, " (", k_source,
              "); expected [", c, ", ", k, "] or [C', ", c, ", ", k, "]");
  if (bias.has_value() && bias->defined()) {
    const int64_t c_out = kernel.dim() == 2 ? c : kernel.size(0);
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == c_out, op, ": bias must be 1-D [C'] = [",
                c_out, "], got shape ", shape_string(*bias));
    check_same_dtype(values, *bias, op, "values", "bias");
    check_same_device(values, *bias, op, "values", "bias");
  }
}

AttentionChecked check_attention_inputs(const at::Tensor& queries, const at::Tensor& keys,
                                        const at::Tensor& values, const at::Tensor& kernel,
                                        const c10::optional<at::Tensor>& bias, int64_t k,
                                        std::string_view similarity,
                                        const c10::optional<at::Tensor>& mask,
                                        std::string_view rho, double temperature,
                                        std::string_view op) {
  AttentionChecked checked;
  checked.similarity = check_select_inputs(queries, keys, k, similarity, mask, op);
  check_kernel_and_bias(values, k, "k", kernel, bias, op);
  check_same_dtype(queries, values, op, "queries", "values");
  check_same_device(queries, values, op, "queries", "values");
  TORCH_CHECK(values.size(0) == keys.size(0) && values.size(1) == keys.size(1), op,
              ": keys and values must have the same G and M (dims 0 and 1), got keys ",
              shape_string(keys), " and values ", shape_string(values));
  checked.rho = parse_rho_argument(rho, (std::string(op) + ": rho").c_str());
  check_temperature(temperature, op);
  return checked;
}

void check_temperature(double temperature, std::string_view where) {
  constexpr double smallest = std::numeric_limits<float>::min();
  TORCH_CHECK(std::isfinite(temperature) && temperature >= smallest, where,
              ": temperature must be finite and at least ", smallest,
              " (the smallest normal float32, in which softmax accumulates), got ", temperature);
}

int64_t output_channels(const at::Tensor& values, const at::Tensor& kernel) {
  return kernel.dim() == 2 ? values.size(2) : kernel.size(0);
}

Similarity check_select_backward_inputs(const at::Tensor& grad_scores, const at::Tensor& queries,
                                        const at::Tensor& keys, const at::Tensor& indices,
                                        const at::Tensor& scores, std::string_view similarity) {
  constexpr std::string_view op = "knn_select_backward";
  check_slot_indices(indices, queries, op);
  const Similarity parsed =
      check_select_inputs(queries, keys, indices.size(2), similarity, c10::nullopt, op);
  check_same_device(indices, queries, op, "indices", "queries");
  check_like_slots(grad_scores, indices, queries, op, "grad_scores");
  check_like_slots(scores, indices, queries, op, "scores");
  check_indices_in_range(indices, keys.size(1), op, "indices");
  return parsed;
}

void check_aggregate_backward_inputs(const at::Tensor& grad_output, const at::Tensor& values,
                                     const at::Tensor& weights, const at::Tensor& indices,
                                     const at::Tensor& kernel, std::string_view op) {
  check_aggregate_inputs(values, weights, indices, kernel, c10::nullopt, op);
  const int64_t c_out = output_channels(values, kernel);
  TORCH_CHECK(grad_output.defined(), op, ": grad_output must be a defined tensor");
  TORCH_CHECK(grad_output.dim() == 3 && grad_output.size(0) == weights.size(0) &&
                  grad_output.size(1) == weights.size(1) && grad_output.size(2) == c_out,
              op, ": grad_output must have shape [G,N,C'] = [", weights.size(0), ", ",
              weights.size(1), ", ", c_out, "], got ", shape_string(grad_output));
  check_same_dtype(grad_output, values, op, "grad_output", "values");
  check_same_device(grad_output, values, op, "grad_output", "values");
}

AttentionChecked check_attention_backward_inputs(
    const at::Tensor& grad_output, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores,
    const at::Tensor& indices, const at::Tensor& weights, std::string_view similarity,
    std::string_view rho, double temperature) {
  constexpr std::string_view op = "knn_attention_backward";
  check_slot_indices(indices, queries, op);
  const auto checked = check_attention_inputs(queries, keys, values, kernel, c10::nullopt,
                                              indices.size(2), similarity, c10::nullopt, rho,
                                              temperature, op);
  check_same_device(indices, queries, op, "indices", "queries");
  check_like_slots(scores, indices, queries, op, "scores");
  check_like_slots(weights, indices, queries, op, "weights");
  check_aggregate_backward_inputs(grad_output, values, weights, indices, kernel, op);
  return checked;
}

void check_indices_in_range(const at::Tensor& indices, int64_t m, std::string_view op,
                            std::string_view argument) {
  if (indices.numel() == 0 || indices.is_meta()) return;  // a meta tensor has no values
  // One reduction pass on the hot path; the position is only searched for once it failed.
  const auto [low, high] = at::aminmax(indices);
  if (low.item<int64_t>() >= 0 && high.item<int64_t>() < m) return;
  const auto bad = (indices < 0) | (indices >= m);
  const auto where = at::nonzero(bad)[0].cpu();
  std::vector<int64_t> pos(where.data_ptr<int64_t>(), where.data_ptr<int64_t>() + where.numel());
  int64_t flat = 0;
  for (size_t d = 0; d < pos.size(); ++d) flat = flat * indices.size(d) + pos[d];
  const int64_t value = indices.reshape({-1})[flat].item<int64_t>();
  TORCH_CHECK(false, op, ": ", argument, " must lie in [0, M) with M = ", m,
              " (values.size(1)), found ", value, " at position [", fmt::format("{}", fmt::join(pos, ", ")), "]");
}

void check_finite(const at::Tensor& t, std::string_view op, std::string_view argument) {
  if (t.numel() == 0 || t.is_meta()) return;  // a meta tensor has a shape but no values
  // One cheap reduction on the hot path: a NaN or an infinity makes the sum non-finite, so a finite
  // sum proves every element finite (isfinite(t).all() costs 30x more). A non-finite sum may also
  // be an overflow of finite values: only then is every element tested, and the position searched.
  const auto accumulate = t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (std::isfinite(t.sum(accumulate).item<double>())) return;
  const auto finite = at::isfinite(t);
  if (finite.all().item<bool>()) return;
  const auto where = at::nonzero(~finite)[0].cpu();
  std::vector<int64_t> pos(where.data_ptr<int64_t>(), where.data_ptr<int64_t>() + where.numel());
  auto element = t;
  for (const int64_t p : pos) element = element.select(0, p);
  TORCH_CHECK(false, op, ": ", argument, " must be finite (NaN and +-inf cannot be ranked), found ",
              element.item<double>(), " at position [", fmt::format("{}", fmt::join(pos, ", ")), "]");
}

void check_rankable(const at::Tensor& ranking_keys, std::string_view op) {
  const auto bad = at::isnan(ranking_keys) | at::isposinf(ranking_keys);
  if (!bad.any().item<bool>()) return;
  const auto where = at::nonzero(bad)[0].cpu();
  TORCH_CHECK(false, op, ": similarity scores must not be NaN or +inf (-inf marks a masked candidate); "
              "found one at [g, i, j] = [", where[0].item<int64_t>(), ", ", where[1].item<int64_t>(),
              ", ", where[2].item<int64_t>(), "]: check queries and keys for NaN or Inf");
}

}  // namespace convnn::checks
