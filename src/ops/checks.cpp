#include "ops/checks.h"

#include <ATen/ATen.h>
#include <ATen/functorch/DynamicLayer.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <utility>

// Every shape rule below reads sizes as SymInts (sym_size, sym_sizes) and states its condition as a
// SymBool checked with TORCH_SYM_CHECK: on a tensor with concrete sizes that is the plain integer
// comparison, on a FakeTensor with symbolic sizes (torch.compile, opcheck's aot_dispatch_dynamic)
// it becomes a guard or a runtime assertion instead of the error "Cannot call sizes() on tensor
// with symbolic sizes/strides". sizes(), size(i) and numel() appear only in the value checks, which
// never run with Scope::kShapesOnly.

namespace convnn::checks {

std::string shape_string(const at::Tensor& t) {
  std::ostringstream out;
  out << '[';
  const auto sizes = t.sym_sizes();
  for (size_t d = 0; d < sizes.size(); ++d) out << (d == 0 ? "" : ", ") << sizes[d];
  out << ']';
  return out.str();
}

namespace {

bool reads_values(Scope scope) { return scope == Scope::kShapesAndValues; }

// a.sym_size(i) == b.sym_size(j) for each pair (i, j), as one SymBool.
c10::SymBool sizes_equal(const at::Tensor& a, const at::Tensor& b,
                         std::initializer_list<std::pair<int64_t, int64_t>> dims) {
  c10::SymBool equal(true);
  for (const auto& [i, j] : dims) equal = equal.sym_and(a.sym_size(i).sym_eq(b.sym_size(j)));
  return equal;
}

// The same rank and sizes.
c10::SymBool same_shape(const at::Tensor& a, const at::Tensor& b) {
  if (a.dim() != b.dim()) return c10::SymBool(false);
  c10::SymBool equal(true);
  for (int64_t d = 0; d < a.dim(); ++d) equal = equal.sym_and(a.sym_size(d).sym_eq(b.sym_size(d)));
  return equal;
}

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

// G' mask slices serve G query slices: G' = G, or G' >= 1 dividing G (ops/mask_slices.h).
c10::SymBool mask_slices_divide(const c10::SymInt& mask_slices, const c10::SymInt& slices) {
  const auto equal = mask_slices.sym_eq(slices);
  const auto concrete = mask_slices.maybe_as_int();
  if (concrete && *concrete < 1) return equal;  // no modulo by 0
  return equal.sym_or(mask_slices.sym_ge(1).sym_and((slices % mask_slices).sym_eq(0)));
}

void check_mask(const at::Tensor& mask, const at::Tensor& queries, const at::Tensor& keys,
                Similarity similarity, std::string_view op, Scope scope) {
  const c10::SymInt g = queries.sym_size(0), n = queries.sym_size(1), m = keys.sym_size(1);
  TORCH_CHECK(mask.dim() == 2 || mask.dim() == 3, op,
              ": mask must be 2-D [N,M] or 3-D [G,N,M], got shape ", shape_string(mask));
  const c10::SymBool shape_ok =
      mask.dim() == 2
          ? sizes_equal(mask, queries, {{0, 1}}).sym_and(sizes_equal(mask, keys, {{1, 1}}))
          : mask_slices_divide(mask.sym_size(0), g).sym_and(sizes_equal(mask, queries, {{1, 1}}))
                .sym_and(sizes_equal(mask, keys, {{2, 1}}));
  TORCH_SYM_CHECK(shape_ok, op, ": mask shape ", shape_string(mask), " does not match [N,M] = [", n,
                  ", ", m, "] or [G',N,M] = [G', ", n, ", ", m, "] with G' dividing G = ", g,
                  " (a mask slice serves G/G' consecutive slices)");
  check_same_device(mask, queries, op, "mask", "queries");
  if (mask.scalar_type() == at::kBool) return;
  TORCH_CHECK(at::isFloatingType(mask.scalar_type()), op,
              ": mask must be bool (true = may be selected) or floating-point (additive), got ",
              mask.scalar_type());
  if (reads_values(scope) && is_distance_similarity(similarity) && mask.numel() > 0 &&
      reads_values_of(mask)) {
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
  TORCH_SYM_CHECK(same_shape(t, indices), op, ": ", name, " must have the shape of indices ",
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
  TORCH_SYM_CHECK(sizes_equal(indices, queries, {{0, 0}, {1, 1}}), op, ": indices ",
                  shape_string(indices), " must be [G,N,k] for queries ", shape_string(queries));
}

// check_select_inputs with k as a SymInt: the backward ops take it from indices.sym_size(2).
Similarity select_inputs(const at::Tensor& queries, const at::Tensor& keys, const c10::SymInt& k,
                         std::string_view similarity_name, const c10::optional<at::Tensor>& mask,
                         std::string_view op, Scope scope) {
  const Similarity similarity =
      parse_similarity(similarity_name, std::string(op) + ": similarity");
  check_rank(queries, 3, op, "queries", "[G,N,D]");
  check_rank(keys, 3, op, "keys", "[G,M,D]");
  check_floating(queries, op, "queries");
  check_same_dtype(queries, keys, op, "queries", "keys");
  check_same_device(queries, keys, op, "queries", "keys");
  TORCH_SYM_CHECK(sizes_equal(queries, keys, {{0, 0}}), op, ": queries and keys must have the same G (dim 0), got queries ",
                  shape_string(queries), " and keys ", shape_string(keys));
  TORCH_SYM_CHECK(sizes_equal(queries, keys, {{2, 2}}), op, ": queries and keys must have the same feature size D (dim 2), got queries ",
                  shape_string(queries), " and keys ", shape_string(keys));
  TORCH_SYM_CHECK(queries.sym_size(2).sym_ge(1), op,
                  ": the feature size D must be at least 1, got queries ", shape_string(queries));
  const c10::SymInt m = keys.sym_size(1);
  TORCH_SYM_CHECK(k.sym_ge(1).sym_and(m.sym_ge(k)), op, ": k must be in [1, M] where M = ", m,
                  " is the number of candidates (keys.size(1)), got k = ", k);
  if (mask.has_value() && mask->defined()) check_mask(*mask, queries, keys, similarity, op, scope);
  if (reads_values(scope)) {
    check_finite(queries, op, "queries");
    check_finite(keys, op, "keys");
  }
  return similarity;
}

}  // namespace

Similarity check_select_inputs(const at::Tensor& queries, const at::Tensor& keys, int64_t k,
                               std::string_view similarity, const c10::optional<at::Tensor>& mask,
                               std::string_view op, Scope scope) {
  return select_inputs(queries, keys, k, similarity, mask, op, scope);
}

void check_aggregate_inputs(const at::Tensor& values, const at::Tensor& weights,
                            const at::Tensor& indices, const at::Tensor& kernel,
                            const c10::optional<at::Tensor>& bias, std::string_view op,
                            Scope scope) {
  check_rank(values, 3, op, "values", "[G,M,C]");
  check_rank(weights, 3, op, "weights", "[G,N,K]");
  check_rank(indices, 3, op, "indices", "[G,N,K]");
  check_same_dtype(values, weights, op, "values", "weights");
  check_same_device(values, weights, op, "values", "weights");
  check_same_device(values, indices, op, "values", "indices");
  TORCH_CHECK(indices.scalar_type() == at::kLong, op, ": indices must be int64, got ",
              indices.scalar_type());
  TORCH_SYM_CHECK(same_shape(weights, indices), op,
                  ": weights and indices must have the same shape [G,N,K], got weights ",
                  shape_string(weights), " and indices ", shape_string(indices));
  TORCH_SYM_CHECK(sizes_equal(values, weights, {{0, 0}}), op,
                  ": values and weights must have the same G (dim 0), got values ",
                  shape_string(values), " and weights ", shape_string(weights));
  const c10::SymInt k = weights.sym_size(2);
  TORCH_SYM_CHECK(k.sym_ge(1), op,
                  ": the neighbour count K (weights.size(2)) must be at least 1, got ", k);
  check_kernel_and_bias(values, k, "weights.size(2)", kernel, bias, op);
  if (reads_values(scope)) check_indices_in_range(indices, values.size(1), op, "indices");
}

void check_kernel_and_bias(const at::Tensor& values, const c10::SymInt& k,
                           std::string_view k_source, const at::Tensor& kernel,
                           const c10::optional<at::Tensor>& bias, std::string_view op) {
  check_rank(values, 3, op, "values", "[G,M,C]");
  check_floating(values, op, "values");
  TORCH_CHECK(kernel.defined() && (kernel.dim() == 2 || kernel.dim() == 3), op,
              ": kernel must be 2-D [C,K] (depthwise) or 3-D [C',C,K] (standard), got shape ",
              kernel.defined() ? shape_string(kernel) : std::string("undefined"));
  check_same_dtype(values, kernel, op, "values", "kernel");
  check_same_device(values, kernel, op, "values", "kernel");
  const c10::SymInt c = values.sym_size(2);
  const c10::SymInt kernel_c = kernel.sym_size(kernel.dim() == 2 ? 0 : 1);
  TORCH_SYM_CHECK(kernel_c.sym_eq(c).sym_and(kernel.sym_size(-1).sym_eq(k)), op, ": kernel shape ",
                  shape_string(kernel), " does not match C = ", c, " (values.size(2)) and K = ", k,
                  " (", k_source, "); expected [", c, ", ", k, "] or [C', ", c, ", ", k, "]");
  if (bias.has_value() && bias->defined()) {
    const c10::SymInt c_out = output_channels_symint(values, kernel);
    TORCH_SYM_CHECK(bias->dim() == 1 ? bias->sym_size(0).sym_eq(c_out) : c10::SymBool(false), op,
                    ": bias must be 1-D [C'] = [", c_out, "], got shape ", shape_string(*bias));
    check_same_dtype(values, *bias, op, "values", "bias");
    check_same_device(values, *bias, op, "values", "bias");
  }
}

namespace {

// check_attention_inputs with k as a SymInt: the backward op takes it from indices.sym_size(2).
AttentionChecked attention_inputs(const at::Tensor& queries, const at::Tensor& keys,
                                  const at::Tensor& values, const at::Tensor& kernel,
                                  const c10::optional<at::Tensor>& bias, const c10::SymInt& k,
                                  std::string_view similarity,
                                  const c10::optional<at::Tensor>& mask, std::string_view rho,
                                  double temperature, std::string_view op, Scope scope) {
  AttentionChecked checked;
  checked.similarity = select_inputs(queries, keys, k, similarity, mask, op, scope);
  check_kernel_and_bias(values, k, "k", kernel, bias, op);
  check_same_dtype(queries, values, op, "queries", "values");
  check_same_device(queries, values, op, "queries", "values");
  TORCH_SYM_CHECK(sizes_equal(values, keys, {{0, 0}, {1, 1}}), op,
                  ": keys and values must have the same G and M (dims 0 and 1), got keys ",
                  shape_string(keys), " and values ", shape_string(values));
  checked.rho = parse_rho_argument(rho, (std::string(op) + ": rho").c_str());
  check_temperature(temperature, op);
  return checked;
}

}  // namespace

AttentionChecked check_attention_inputs(const at::Tensor& queries, const at::Tensor& keys,
                                        const at::Tensor& values, const at::Tensor& kernel,
                                        const c10::optional<at::Tensor>& bias, int64_t k,
                                        std::string_view similarity,
                                        const c10::optional<at::Tensor>& mask,
                                        std::string_view rho, double temperature,
                                        std::string_view op, Scope scope) {
  return attention_inputs(queries, keys, values, kernel, bias, k, similarity, mask, rho,
                          temperature, op, scope);
}

Rho check_rho_aggregate_inputs(const at::Tensor& scores, const at::Tensor& indices, const at::Tensor& values,
                               const at::Tensor& kernel, const c10::optional<at::Tensor>& bias,
                               std::string_view rho, double temperature, std::string_view op, Scope scope) {
  // The scores stand where knn_aggregate takes the weights (the kernel makes the weights from them):
  // named as scores first, then the aggregation's rules hold the rest.
  check_rank(scores, 3, op, "scores", "[G,N,K]");
  check_floating(scores, op, "scores");
  check_same_dtype(values, scores, op, "values", "scores");
  check_same_device(values, scores, op, "values", "scores");
  TORCH_SYM_CHECK(same_shape(scores, indices), op, ": scores and indices must have the same shape [G,N,K], got scores ",
                  shape_string(scores), " and indices ", shape_string(indices));
  check_aggregate_inputs(values, scores, indices, kernel, bias, op, scope);
  const Rho parsed = parse_rho_argument(rho, (std::string(op) + ": rho").c_str());
  check_temperature(temperature, op);
  return parsed;
}

void check_temperature(double temperature, std::string_view where) {
  constexpr double smallest = std::numeric_limits<float>::min();
  TORCH_CHECK(std::isfinite(temperature) && temperature >= smallest, where,
              ": temperature must be finite and at least ", smallest,
              " (the smallest normal float32, in which softmax accumulates), got ", temperature);
}

c10::SymInt output_channels_symint(const at::Tensor& values, const at::Tensor& kernel) {
  return kernel.dim() == 2 ? values.sym_size(2) : kernel.sym_size(0);
}

int64_t output_channels(const at::Tensor& values, const at::Tensor& kernel) {
  return output_channels_symint(values, kernel).guard_int(__FILE__, __LINE__);
}

Similarity check_select_backward_inputs(const at::Tensor& grad_scores, const at::Tensor& queries,
                                        const at::Tensor& keys, const at::Tensor& indices,
                                        const at::Tensor& scores, std::string_view similarity,
                                        Scope scope) {
  constexpr std::string_view op = "knn_select_backward";
  check_slot_indices(indices, queries, op);
  const Similarity parsed =
      select_inputs(queries, keys, indices.sym_size(2), similarity, c10::nullopt, op, scope);
  check_same_device(indices, queries, op, "indices", "queries");
  check_like_slots(grad_scores, indices, queries, op, "grad_scores");
  check_like_slots(scores, indices, queries, op, "scores");
  if (reads_values(scope)) check_indices_in_range(indices, keys.size(1), op, "indices");
  return parsed;
}

void check_aggregate_backward_inputs(const at::Tensor& grad_output, const at::Tensor& values,
                                     const at::Tensor& weights, const at::Tensor& indices,
                                     const at::Tensor& kernel, std::string_view op, Scope scope) {
  check_aggregate_inputs(values, weights, indices, kernel, c10::nullopt, op, scope);
  const c10::SymInt c_out = output_channels_symint(values, kernel);
  TORCH_CHECK(grad_output.defined(), op, ": grad_output must be a defined tensor");
  TORCH_SYM_CHECK(grad_output.dim() == 3
                      ? sizes_equal(grad_output, weights, {{0, 0}, {1, 1}})
                            .sym_and(grad_output.sym_size(2).sym_eq(c_out))
                      : c10::SymBool(false),
                  op, ": grad_output must have shape [G,N,C'] = [", weights.sym_size(0), ", ",
                  weights.sym_size(1), ", ", c_out, "], got ", shape_string(grad_output));
  check_same_dtype(grad_output, values, op, "grad_output", "values");
  check_same_device(grad_output, values, op, "grad_output", "values");
}

AttentionChecked check_attention_backward_inputs(
    const at::Tensor& grad_output, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores,
    const at::Tensor& indices, const at::Tensor& weights, std::string_view similarity,
    std::string_view rho, double temperature, Scope scope) {
  constexpr std::string_view op = "knn_attention_backward";
  check_slot_indices(indices, queries, op);
  const auto checked =
      attention_inputs(queries, keys, values, kernel, c10::nullopt, indices.sym_size(2),
                       similarity, c10::nullopt, rho, temperature, op, scope);
  check_same_device(indices, queries, op, "indices", "queries");
  check_like_slots(scores, indices, queries, op, "scores");
  check_like_slots(weights, indices, queries, op, "weights");
  check_aggregate_backward_inputs(grad_output, values, weights, indices, kernel, op, scope);
  return checked;
}

namespace {
// Under torch.vmap a tensor holds a batch of samples and reading a value (Tensor.item()) is
// refused, so the value checks do not run there; a NaN then reaches the output rows it touches.
bool under_vmap() {
  for (const auto& layer : at::functorch::getDynamicLayerStack()) {
    if (layer.key() == at::functorch::TransformType::Vmap) return true;
  }
  return false;
}
}  // namespace

namespace {
enum class ValueReads { kCpuOnly, kEverywhere, kNowhere };

ValueReads value_reads() {
  static const ValueReads reads = [] {
    const char* value = std::getenv("CONVNN_DEVICE_VALUE_CHECKS");
    if (value == nullptr || std::string_view(value).empty()) return ValueReads::kCpuOnly;
    if (std::string_view(value) == "1") return ValueReads::kEverywhere;
    if (std::string_view(value) == "0") return ValueReads::kNowhere;
    TORCH_WARN("CONVNN_DEVICE_VALUE_CHECKS must be 1 (read values on every device) or 0 (on none), "
               "got '", value, "'; reading them on CPU tensors only");
    return ValueReads::kCpuOnly;
  }();
  return reads;
}
}  // namespace

bool reads_values_everywhere() { return value_reads() == ValueReads::kEverywhere; }

bool reads_values_of(const at::Tensor& t) {
  if (under_vmap() || t.is_meta()) return false;
  switch (value_reads()) {
    case ValueReads::kEverywhere: return true;
    case ValueReads::kNowhere: return false;
    case ValueReads::kCpuOnly: return t.is_cpu();
  }
  return t.is_cpu();
}

// The position of the first true element of `mask` (row-major order), as a contiguous CPU tensor:
// at::nonzero's result is laid out column-major, so its rows cannot be read through a data pointer.
namespace {
at::Tensor first_position(const at::Tensor& mask) { return at::nonzero(mask)[0].to(at::kCPU).contiguous(); }
}  // namespace

void check_indices_in_range(const at::Tensor& indices, int64_t m, std::string_view op,
                            std::string_view argument) {
  if (indices.numel() == 0 || !reads_values_of(indices)) return;
  // One reduction pass on the hot path; the position is only searched for once it failed.
  const auto [low, high] = at::aminmax(indices);
  if (low.item<int64_t>() >= 0 && high.item<int64_t>() < m) return;
  const auto bad = (indices < 0) | (indices >= m);
  const auto where = first_position(bad);
  std::vector<int64_t> pos(where.data_ptr<int64_t>(), where.data_ptr<int64_t>() + where.numel());
  int64_t flat = 0;
  for (size_t d = 0; d < pos.size(); ++d) flat = flat * indices.size(d) + pos[d];
  const int64_t value = indices.reshape({-1})[flat].item<int64_t>();
  TORCH_CHECK(false, op, ": ", argument, " must lie in [0, M) with M = ", m,
              " (values.size(1)), found ", value, " at position [", fmt::format("{}", fmt::join(pos, ", ")), "]");
}

void check_finite(const at::Tensor& t, std::string_view op, std::string_view argument) {
  if (t.numel() == 0 || !reads_values_of(t)) return;
  // One cheap reduction on the hot path: a NaN or an infinity makes the sum non-finite, so a finite
  // sum proves every element finite (isfinite(t).all() costs 30x more). A non-finite sum may also
  // be an overflow of finite values: only then is every element tested, and the position searched.
  const auto accumulate = t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (std::isfinite(t.sum(accumulate).item<double>())) return;
  const auto finite = at::isfinite(t);
  if (finite.all().item<bool>()) return;
  const auto where = first_position(~finite);
  std::vector<int64_t> pos(where.data_ptr<int64_t>(), where.data_ptr<int64_t>() + where.numel());
  auto element = t;
  for (const int64_t p : pos) element = element.select(0, p);
  TORCH_CHECK(false, op, ": ", argument, " must be finite (NaN and +-inf cannot be ranked), found ",
              element.item<double>(), " at position [", fmt::format("{}", fmt::join(pos, ", ")), "]");
}

void check_rankable(const at::Tensor& ranking_keys, std::string_view op) {
  if (under_vmap()) return;
  const auto bad = at::isnan(ranking_keys) | at::isposinf(ranking_keys);
  if (!bad.any().item<bool>()) return;
  const auto where = at::nonzero(bad)[0].cpu();
  TORCH_CHECK(false, op, ": similarity scores must not be NaN or +inf (-inf marks a masked candidate); "
              "found one at [g, i, j] = [", where[0].item<int64_t>(), ", ", where[1].item<int64_t>(),
              ", ", where[2].item<int64_t>(),
              "]: check queries and keys for NaN or Inf, and an additive mask for NaN or +inf");
}

}  // namespace convnn::checks
