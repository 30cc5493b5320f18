#include "convnn/nn/functional/convnn.h"

#include <ATen/ATen.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <algorithm>

#include <cmath>
#include <functional>
#include <limits>

#include "convnn/ops/knn_ops.h"
#include "nn/functional/spatial.h"
#include "nn/functional/symint_forms.h"
#include "ops/checks.h"
#include "ops/mask_slices.h"
#include "ops/reference/indexing.h"
#include "ops/reference/reference.h"

namespace convnn::nn::functional {
namespace {

using checks::shape_string;

// This file's forms run inside the CompositeImplicitAutograd layer ops, which torch.compile and
// torch.export trace with symbolic sizes. So sizes are read only as SymInts (sym_size) or left to
// ATen to infer (unflatten with -1): a concrete size() would specialise the traced program to this
// call's batch and token counts. On concrete tensors a SymInt is a plain int.

using detail::fold_heads;
using detail::unfold_heads;

// Grouped-query attention without copying a key/value head per query head: the `group` query
// heads that share a key/value head become one slice of group*N query rows against that head's
// keys ([B*H,N,d] -> [B*H/group, group*N, d], a view of the folded queries). Selection, rho and the
// aggregation are per query row, so every op and backend serves it unchanged.
at::Tensor pack_query_groups(const at::Tensor& folded, int64_t group) {
  return group == 1 ? folded : folded.unflatten(0, {-1, group}).flatten(1, 2);
}

// [B*H/group, group*N, c] -> [B*H, N, c], the inverse of pack_query_groups.
at::Tensor unpack_query_groups(const at::Tensor& packed, int64_t group) {
  return group == 1 ? packed : packed.unflatten(1, {group, -1}).flatten(0, 1);
}

// A mask over the grouped slices: a shared [N,M] mask repeated for the group's rows, a per-slice
// [B*H,N,M] one regrouped as the queries are.
at::Tensor pack_mask_groups(const at::Tensor& mask, int64_t group) {
  if (!mask.defined() || group == 1) return mask;
  if (mask.dim() == 2) return mask.repeat({group, 1});
  return mask.unflatten(0, {-1, group}).flatten(1, 2);
}

// Whether the mask is one per sample ([B,N,M]) rather than per (sample, head) slice ([B*H,N,M]): the
// op reads a sample's slice for each of its heads (ops/mask_slices.h), with no copy per head. With
// one head the two are the same.
bool mask_per_sample(const at::Tensor& mask, const at::Tensor& queries, int64_t heads) {
  if (!mask.defined() || mask.dim() != 3 || heads == 1) return false;
  return !mask.sym_size(0).sym_eq(queries.sym_size(0) * heads).guard_bool(__FILE__, __LINE__);
}

// Whether packing `heads / kv_heads` query heads per slice would copy more bytes repeating a shared
// [N,M] mask for the group's rows than repeating the keys and values per query head: at long
// sequences it does (N = M = 16384, 4 heads per group: a 1 GiB bool mask against 0.1 GiB of keys and
// values at B = 2, d = 64). Both are exact. Decided on concrete sizes only: under tracing the sizes
// are symbolic and packing stays, so that a traced program does not specialise on them.
bool shared_mask_outweighs_kv(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
                              const at::Tensor& mask, int64_t heads, int64_t kv_heads) {
  if (!mask.defined() || mask.dim() != 2) return false;
  const auto b = queries.sym_size(0).maybe_as_int(), n = queries.sym_size(1).maybe_as_int(),
             m = keys.sym_size(1).maybe_as_int(), ck = keys.sym_size(2).maybe_as_int(),
             cv = values.sym_size(2).maybe_as_int();
  if (!b || !n || !m || !ck || !cv) return false;
  const double mask_bytes = static_cast<double>(heads / kv_heads - 1) * static_cast<double>(*n) *
                            static_cast<double>(*m) * static_cast<double>(mask.element_size());
  const double kv_bytes = static_cast<double>(*b) * static_cast<double>(heads - kv_heads) * static_cast<double>(*m) *
                          static_cast<double>((*ck + *cv) / kv_heads) * static_cast<double>(keys.element_size());
  return mask_bytes > kv_bytes;
}

// Similarity features [sqrt(alpha) x, sqrt(1-alpha) p]; exactly x or p at the ends, so that
// alpha = 0 is pure convolution and alpha = 1 pure attention.
at::Tensor blend_coordinates(const at::Tensor& x, const at::Tensor& coordinates, double alpha) {
  if (!coordinates.defined() || alpha == 1.0) return x;
  const auto p = coordinates.to(x.scalar_type()).unsqueeze(0).expand_symint(
      {x.sym_size(0), coordinates.sym_size(0), coordinates.sym_size(1)});
  if (alpha == 0.0) return p.contiguous();
  return at::cat({x * std::sqrt(alpha), p * std::sqrt(1.0 - alpha)}, -1);
}

}  // namespace

namespace detail {

// The shape rules below are TORCH_SYM_CHECKs, as the core ops' (src/ops/checks.cpp): a plain check
// eagerly, and under tracing a runtime assertion of the traced program rather than a guard that
// would narrow (or specialise) the dynamic dimensions.
void check_candidates(const ConvNNFuncOptions& o, const c10::SymInt& m, std::string_view where) {
  TORCH_SYM_CHECK(c10::SymBool(o.num_candidates() >= 0) & m.sym_ge(o.num_candidates()), where,
                  ": num_candidates (r) must be in [0, M] with M = ", m,
                  " candidates (0 = all), got r = ", o.num_candidates());
  const c10::SymInt candidates = o.num_candidates() == 0 ? m : c10::SymInt(o.num_candidates());
  TORCH_SYM_CHECK(c10::SymBool(o.k() >= 1) & candidates.sym_ge(o.k()), where, ": k must be in [1, ",
                  candidates, "] (the number of candidates", o.num_candidates() ? ", r" : ", M",
                  "), got k = ", o.k());
}

}  // namespace detail

namespace {

void check_conv_nn_inputs(const at::Tensor& queries, const at::Tensor& keys,
                          const at::Tensor& values, const at::Tensor& kernel,
                          const at::Tensor& bias, const ConvNNFuncOptions& o,
                          const at::Tensor& coordinates, const at::Tensor& query_coordinates) {
  constexpr const char* op = "conv_nn";
  TORCH_CHECK(queries.defined() && queries.dim() == 3, op,
              ": queries must be 3-D [B,N,D], got ", queries.defined() ? shape_string(queries) : "undefined");
  TORCH_CHECK(keys.defined() && keys.dim() == 3, op, ": keys must be 3-D [B,M,D], got ",
              keys.defined() ? shape_string(keys) : "undefined");
  TORCH_CHECK(values.defined() && values.dim() == 3, op, ": values must be 3-D [B,M,C], got ",
              values.defined() ? shape_string(values) : "undefined");
  TORCH_SYM_CHECK(keys.sym_size(1).sym_eq(values.sym_size(1)) & keys.sym_size(0).sym_eq(values.sym_size(0)),
                  op, ": keys ", shape_string(keys), " and values ", shape_string(values),
                  " must have the same B and M");
  TORCH_SYM_CHECK(queries.sym_size(0).sym_eq(keys.sym_size(0)), op, ": queries ", shape_string(queries),
                  " and keys ", shape_string(keys), " must have the same batch size B");
  const int64_t h = o.heads();
  TORCH_CHECK(h >= 1, op, ": heads must be at least 1, got ", h);
  TORCH_CHECK(o.kv_heads() >= 0 && (o.kv_heads() == 0 || h % o.kv_heads() == 0), op, ": kv_heads = ", o.kv_heads(),
              " must divide heads = ", h, " (0 = heads)");
  const int64_t kv = o.kv_heads() == 0 ? h : o.kv_heads();
  if (kv == h) {
    TORCH_SYM_CHECK((queries.sym_size(2) % h).sym_eq(0) & (values.sym_size(2) % h).sym_eq(0), op,
                    ": heads = ", h, " must divide the query channels (", queries.sym_size(2),
                    ") and value channels (", values.sym_size(2), ")");
  } else {
    TORCH_SYM_CHECK((queries.sym_size(2) % h).sym_eq(0) & (keys.sym_size(2) % kv).sym_eq(0) &
                        (values.sym_size(2) % kv).sym_eq(0) &
                        (queries.sym_size(2) / h).sym_eq(keys.sym_size(2) / kv),
                    op, ": with heads = ", h, " and kv_heads = ", kv, ", queries ", shape_string(queries),
                    " must have heads * d channels and keys ", shape_string(keys),
                    " kv_heads * d (the same d per head), and kv_heads must divide the value channels (",
                    values.sym_size(2), ")");
  }
  TORCH_CHECK(o.padding() == 0, op, ": padding = ", o.padding(),
              " applies to spatial inputs only (conv_nn1d / conv_nn2d / conv_nn3d); token inputs take 0");
  const auto all_ones = [](const std::vector<int64_t>& v) {
    return std::all_of(v.begin(), v.end(), [](int64_t x) { return x == 1; });
  };
  TORCH_CHECK(all_ones(o.stride()) && all_ones(o.dilation()), op, ": stride = ", c10::IntArrayRef(o.stride()),
              " and dilation = ", c10::IntArrayRef(o.dilation()), " apply to spatial inputs only (conv_nn1d / conv_nn2d / conv_nn3d); token inputs take 1");
  TORCH_CHECK(o.alpha() >= 0.0 && o.alpha() <= 1.0, op, ": alpha must be in [0, 1], got ",
              o.alpha());
  checks::check_temperature(o.temperature(), op);
  const c10::SymInt n = queries.sym_size(1), m = keys.sym_size(1);
  detail::check_candidates(o, m, op);
  TORCH_SYM_CHECK(c10::SymBool(!o.include_self()) | n.sym_eq(m), op,
                  ": include_self needs queries and keys from the same tokens (N == M), got N = ", n,
                  " and M = ", m);
  if (o.mask().defined()) {
    // Checked here, not only in knn_select: random candidates slice the mask before the op sees it.
    const auto& mask = o.mask();
    const c10::SymInt g = queries.sym_size(0) * h;
    const auto has_shape = [&](std::initializer_list<c10::SymInt> shape) {
      if (mask.dim() != static_cast<int64_t>(shape.size())) return c10::SymBool(false);
      c10::SymBool equal(true);
      int64_t d = 0;
      for (const auto& size : shape) equal = equal & mask.sym_size(d++).sym_eq(size);
      return equal;
    };
    TORCH_SYM_CHECK(has_shape({n, m}) | has_shape({queries.sym_size(0), n, m}) | has_shape({g, n, m}), op,
                    ": mask must be [N,M] = [", n, ", ", m, "], [B,N,M] = [", queries.sym_size(0), ", ", n, ", ", m,
                    "] (per sample) or [B*heads,N,M] = [", g, ", ", n, ", ", m, "], got shape ", shape_string(mask));
  }
  if (coordinates.defined() && query_coordinates.is_same(coordinates)) {
    const auto shape_ok =
        coordinates.dim() == 2 ? n.sym_eq(m) & coordinates.sym_size(0).sym_eq(n) : c10::SymBool(false);
    TORCH_SYM_CHECK(shape_ok, op, ": coordinates must be [N,P] with N = M = ", n, ", got ",
                    shape_string(coordinates), " (N = ", n, ", M = ", m, ")");
  } else if (coordinates.defined()) {  // the queries a subset of the tokens (spatial stride)
    const auto shape_ok = coordinates.dim() == 2 && query_coordinates.defined() && query_coordinates.dim() == 2
                              ? coordinates.sym_size(0).sym_eq(m) & query_coordinates.sym_size(0).sym_eq(n) &
                                    query_coordinates.sym_size(1).sym_eq(coordinates.sym_size(1))
                              : c10::SymBool(false);
    TORCH_SYM_CHECK(shape_ok, op, ": key coordinates must be [M,P] and query coordinates [N,P], got ",
                    shape_string(coordinates), " and ",
                    query_coordinates.defined() ? shape_string(query_coordinates) : "undefined");
  } else {
    TORCH_CHECK(o.alpha() == 1.0, op, ": alpha = ", o.alpha(),
                " blends feature and positional similarity, but no coordinates were given");
  }
  const int64_t kernel_rank =
      (kernel.defined() ? kernel.dim() : 0) - (o.kernel_per_head() ? 1 : 0);
  TORCH_CHECK(kernel.defined() && (kernel_rank == 2 || kernel_rank == 3), op,
              ": kernel must be [dv,K] or [dv',dv,K]", o.kernel_per_head() ? " with a leading head dimension H" : "",
              ", got ", kernel.defined() ? shape_string(kernel) : "undefined");
  if (o.kernel_per_head()) {
    TORCH_SYM_CHECK(kernel.sym_size(0).sym_eq(h), op, ": kernel_per_head needs kernel.size(0) == heads = ", h,
                    ", got kernel ", shape_string(kernel));
  }
  if (bias.defined()) {
    TORCH_CHECK(bias.dim() == (o.kernel_per_head() ? 2 : 1), op, ": bias must be ",
                o.kernel_per_head() ? "[H,dv']" : "[dv']", ", got ", shape_string(bias));
  }
}

// Adds the query itself to its random candidates: top-k of (drawn U {i}) is the top-k of
// (top-k of drawn U {i}). Its score comes from knn_select on the single pair (so it is exactly the
// score the op would give, mask included); when i was drawn anyway, the extra copy is masked.
std::pair<at::Tensor, at::Tensor> merge_self(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& scores, const at::Tensor& indices,
                                             const at::Tensor& drawn, const at::Tensor& mask,
                                             const ConvNNFuncOptions& o) {
  const c10::SymInt g = q.sym_size(0), n = q.sym_size(1);
  at::Tensor self_mask;
  if (mask.defined()) {
    self_mask = mask.diagonal(0, -2, -1).expand_symint({g, n}).reshape({-1, 1, 1});
  }
  // Each (query, itself) pair as its own group of one query and one key: [G*N,1,D].
  const auto pairs = [](const at::Tensor& t) { return t.flatten(0, 1).unsqueeze(1); };
  auto [self_scores, unused] = ops::knn_select(
      pairs(q), pairs(k), 1, to_string(o.similarity()),
      self_mask.defined() ? c10::optional<at::Tensor>(self_mask) : c10::nullopt, false);
  // at::arange takes the token count as a Scalar, which holds a SymInt under tracing.
  const auto tokens = at::arange(c10::Scalar(n), indices.options());
  auto self_index = tokens.expand_symint({g, n}).unsqueeze(-1);
  const auto already_drawn = at::isin(tokens.to(drawn.options()), drawn).view({1, -1, 1});
  const auto neg_inf = at::scalar_tensor(-std::numeric_limits<double>::infinity(), scores.options());
  auto self_score = at::where(already_drawn, neg_inf, self_scores.view_symint({g, n, 1}));

  auto all_scores = at::cat({scores, self_score}, -1);
  auto all_indices = at::cat({indices, self_index}, -1);
  // Two stable sorts: by index, then by descending score, so equal scores keep the lower index.
  auto by_index = std::get<1>(reference::stable_sort(all_indices, /*descending=*/false));
  all_scores = all_scores.gather(-1, by_index);
  all_indices = all_indices.gather(-1, by_index);
  auto by_score = std::get<1>(reference::stable_sort(all_scores, /*descending=*/true))
                      .narrow(-1, 0, o.k());
  return {all_scores.gather(-1, by_score), all_indices.gather(-1, by_score)};
}

std::pair<at::Tensor, at::Tensor> sort_slots_by_index(const at::Tensor& scores,
                                                      const at::Tensor& indices) {
  auto [sorted, permutation] = reference::stable_sort(indices, /*descending=*/false);
  return {scores.gather(-1, permutation), sorted};
}

c10::optional<at::Tensor> optional_bias(const at::Tensor& bias) {
  return bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt;
}

at::Tensor aggregate(const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
                     const at::Tensor& kernel, const at::Tensor& bias) {
  return ops::knn_aggregate(values, weights, indices, kernel, optional_bias(bias));
}

// kernel_per_head: one call per query head on that head's slices of the folded batch ([B*H,N,K]
// weights and indices), with the values of its key/value head ([B*kv_heads,M,dv]).
at::Tensor aggregate_per_head(const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
                              const at::Tensor& kernel, const at::Tensor& bias, int64_t heads, int64_t kv_heads) {
  std::vector<at::Tensor> outputs;
  for (int64_t head = 0; head < heads; ++head) {
    const auto slice = [&](const at::Tensor& t, int64_t count, int64_t index) {
      return t.unflatten(0, {-1, count}).select(1, index);
    };
    outputs.push_back(ops::knn_aggregate(slice(values, kv_heads, head / (heads / kv_heads)),
                                         slice(weights, heads, head), slice(indices, heads, head), kernel[head],
                                         optional_bias(bias.defined() ? bias[head] : bias)));
  }
  return detail::merge_leading_dims(at::stack(outputs, 1));  // [B,H,N,dv'] -> [B*H,N,dv']
}

// How the query heads share key/value heads in one call: `group` query heads per packed slice
// (1 when the key/value heads were repeated per query head).
struct HeadGroups {
  int64_t heads, kv_heads, group;
};

using KeepSelection = std::function<void(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;

// The aggregation of packed slices ([B*H/group, group*N, K] weights and indices) -> [B*H,N,dv'].
at::Tensor aggregate_heads(const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
                           const at::Tensor& kernel, const at::Tensor& bias, const ConvNNFuncOptions& o,
                           const HeadGroups& g) {
  if (!o.kernel_per_head()) {
    return unpack_query_groups(aggregate(values, weights, indices, kernel, bias), g.group);
  }
  return aggregate_per_head(values, unpack_query_groups(weights, g.group), unpack_query_groups(indices, g.group),
                            kernel, bias, g.heads, g.group == 1 ? g.heads : g.kv_heads);
}

// Selection, rho and aggregation of packed query slices against their key/value slices (no random
// candidates merged with the query): the fused op where it applies, else the three ops.
// Returns [B*H,N,dv'], and hands the selection ([packed] indices, scores, weights) to `keep`.
at::Tensor select_and_aggregate(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                                const at::Tensor& kernel, const at::Tensor& bias, const ConvNNFuncOptions& o,
                                const c10::optional<at::Tensor>& mask, const HeadGroups& g,
                                const KeepSelection& keep) {
  const bool index_order = o.slot_order() == SlotOrder::Index;
  if (o.fused() && !o.kernel_per_head()) {
    const auto [output, scores, indices, weights] =
        ops::knn_attention(q, keys, values, kernel, optional_bias(bias), o.k(), to_string(o.similarity()), mask,
                           index_order, to_string(o.rho()), o.temperature());
    if (keep) keep(indices, scores, weights);
    return unpack_query_groups(output, g.group);
  }
  const auto [scores, indices] = ops::knn_select(q, keys, o.k(), to_string(o.similarity()), mask, index_order);
  const auto weights = rho_weights(scores, o.rho(), o.temperature());
  if (keep) keep(indices, scores, weights);
  return aggregate_heads(values, weights, indices, kernel, bias, o, g);
}

// Every query head against its own key/value head, through the fused op, with the heads as a
// dimension: [B,N,H*d] -> [B,H,N,d] are views (a head-split projection is read in place), and the
// op writes the output as [B,N,H,C], so [B,N,H*C] is a view too. The [B*H,N,d] folds and their
// copies are the op's business, and only on a path that cannot read strided heads.
at::Tensor attention_by_head_views(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
                                   const at::Tensor& kernel, const at::Tensor& bias, const ConvNNFuncOptions& o,
                                   const at::Tensor& mask, bool mask_per_sample, const KeepSelection& keep) {
  const int64_t h = o.heads();
  const auto by_head = [&](const at::Tensor& x) { return x.unflatten(2, {h, -1}).transpose(1, 2); };
  // [B*H,N,M] -> [B,H,N,M]; a per-sample [B,N,M] -> [B,1,N,M], for each of the sample's heads.
  const auto head_mask = !mask.defined() || mask.dim() != 3 ? mask
                         : mask_per_sample           ? mask.unsqueeze(1)
                                                     : mask.unflatten(0, {-1, h});
  const auto [output, scores, indices, weights] = ops::knn_attention(
      by_head(queries), by_head(keys), by_head(values), kernel, optional_bias(bias), o.k(),
      to_string(o.similarity()), head_mask.defined() ? c10::optional<at::Tensor>(head_mask) : c10::nullopt,
      o.slot_order() == SlotOrder::Index, to_string(o.rho()), o.temperature());
  if (keep) keep(indices, scores, weights);  // [B,H,N,K]
  return output.transpose(1, 2).flatten(2);
}

}  // namespace

at::Tensor conv_nn(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
                   const at::Tensor& kernel, const at::Tensor& bias,
                   const ConvNNFuncOptions& o, const at::Tensor& coordinates) {
  return detail::conv_nn_with_query_coordinates(queries, keys, values, kernel, bias, o, coordinates, coordinates);
}

namespace detail {

at::Tensor conv_nn_with_query_coordinates(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
                                          const at::Tensor& kernel, const at::Tensor& bias, const ConvNNFuncOptions& o,
                                          const at::Tensor& query_coordinates, const at::Tensor& key_coordinates,
                                          Selection* selection) {
  check_conv_nn_inputs(queries, keys, values, kernel, bias, o, key_coordinates, query_coordinates);
  const int64_t h = o.heads();
  const c10::SymInt m = keys.sym_size(1);
  const bool random = o.num_candidates() > 0 && o.num_candidates() < m;
  const bool merge = random && o.include_self();
  const bool index_order = o.slot_order() == SlotOrder::Index;
  // Grouped heads: `group` query heads per key/value head, packed into one slice (pack_query_groups).
  // The key/value heads are repeated per query head instead (a copy) where packing cannot serve
  // (merge_self pairs each query row with its own token) or would copy more (shared_mask_outweighs_kv).
  const int64_t kv = o.kv_heads() == 0 ? h : o.kv_heads();
  // A per-sample mask serves the op's slices of one query head each as it is (the packed slices' rows
  // would need it repeated per head).
  const bool per_sample = mask_per_sample(o.mask(), queries, h);
  const bool repeat_kv =
      kv < h && (merge || per_sample || shared_mask_outweighs_kv(queries, keys, values, o.mask(), h, kv));
  const int64_t group = repeat_kv ? 1 : h / kv;
  const auto kv_fold = [&](const at::Tensor& x) {
    if (!repeat_kv) return fold_heads(x, kv);
    return fold_heads(x.unflatten(2, {kv, 1, -1}).expand_symint({x.sym_size(0), x.sym_size(1), kv, h / kv,
                                                                  x.sym_size(2) / kv}).flatten(2), h);
  };
  const auto blends = [&](const at::Tensor& coordinates) { return coordinates.defined() && o.alpha() != 1.0; };
  // Heads as a dimension where the device's kernels read them in place; elsewhere the op would fold
  // them into copies, and folding here lets autograd save the folds, not refold them backward.
  if (h > 1 && kv == h && !random && !blends(query_coordinates) && !blends(key_coordinates) && o.fused() &&
      !o.kernel_per_head() && ops::knn_attention_reads_head_dims_in_place(queries)) {
    const auto keep = [&](const at::Tensor& indices, const at::Tensor& scores, const at::Tensor& weights) {
      if (selection == nullptr) return;
      const auto folded = [](const at::Tensor& t) { return detail::merge_leading_dims(t.detach()); };
      *selection = {folded(indices), folded(scores), folded(weights)};  // [B*H,N,K], as the other paths
    };
    return attention_by_head_views(queries, keys, values, kernel, bias, o, o.mask(), per_sample, keep);
  }
  const auto query_coordinates_rows =
      query_coordinates.defined() && group > 1 ? query_coordinates.repeat({group, 1}) : query_coordinates;
  const auto q = blend_coordinates(pack_query_groups(fold_heads(queries, h), group), query_coordinates_rows,
                                   o.alpha());
  const auto k = blend_coordinates(kv_fold(keys), key_coordinates, o.alpha());
  const auto v = kv_fold(values);

  at::Tensor drawn, candidate_keys = k, candidate_mask = pack_mask_groups(o.mask(), group);
  if (random) {
    drawn = detail::draw_candidates_symint(m, o.num_candidates(), o.generator(), keys.device());
    candidate_keys = k.index_select(1, drawn);
    if (candidate_mask.defined()) candidate_mask = candidate_mask.index_select(-1, drawn);
  }
  const auto candidate_mask_arg =
      candidate_mask.defined() ? c10::optional<at::Tensor>(candidate_mask) : c10::nullopt;
  // Random candidates aggregate over the r candidate rows with slot indices: the same sum (slot
  // order is index order), and the ops see M = r < N value rows (the aggregation's value side).
  const auto candidate_values = random && !merge ? v.index_select(1, drawn) : v;
  // What the caller records: candidate slots mapped back to their tokens (merge_self's indices are
  // tokens already).
  const auto keep = [&](const at::Tensor& indices, const at::Tensor& scores, const at::Tensor& weights) {
    if (selection == nullptr) return;
    const auto tokens = random && !merge ? drawn.index_select(0, indices.reshape({-1})).view_as(indices) : indices;
    *selection = {unpack_query_groups(tokens.detach(), group), unpack_query_groups(scores.detach(), group),
                  unpack_query_groups(weights.detach(), group)};
  };
  if (!merge) {
    return unfold_heads(select_and_aggregate(q, candidate_keys, candidate_values, kernel, bias, o,
                                             candidate_mask_arg, {h, kv, group}, keep),
                        h);
  }
  auto [scores, indices] = ops::knn_select(q, candidate_keys, o.k(), to_string(o.similarity()),
                                           candidate_mask_arg, /*index_order=*/false);
  // Candidate slot -> token index (drawn is sorted, so slot order is index order); the query
  // itself is then a token outside the candidates.
  indices = drawn.index_select(0, indices.reshape({-1})).view_as(indices);
  const auto mask_of_every_head = per_sample ? ops::mask_of_every_slice(o.mask(), queries.sym_size(0) * h) : o.mask();
  std::tie(scores, indices) = merge_self(q, k, scores, indices, drawn, mask_of_every_head, o);
  if (index_order) std::tie(scores, indices) = sort_slots_by_index(scores, indices);
  const auto weights = rho_weights(scores, o.rho(), o.temperature());
  keep(indices, scores, weights);
  return unfold_heads(aggregate_heads(candidate_values, weights, indices, kernel, bias, o, {h, h, 1}), h);
}

at::Tensor conv_nn_folded_kv(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
                             const at::Tensor& kernel, const at::Tensor& bias, const ConvNNFuncOptions& o) {
  const int64_t h = o.heads(), kv = o.kv_heads() == 0 ? h : o.kv_heads();
  TORCH_CHECK(queries.dim() == 3 && keys.dim() == 3 && values.dim() == 3 && h % kv == 0 &&
                  keys.size(0) == queries.size(0) * kv && values.size(0) == keys.size(0) &&
                  values.size(1) == keys.size(1) && queries.size(2) == h * keys.size(2),
              "conv_nn: queries [B,N,H*d] and folded keys and values [B*kv_heads,M,d] expected, got ",
              queries.sizes(), ", ", keys.sizes(), " and ", values.sizes(), " with heads = ", h, ", kv_heads = ", kv);
  TORCH_CHECK(o.num_candidates() == 0 && o.alpha() == 1.0, "conv_nn: folded keys take no random candidates and no "
              "coordinates");
  detail::check_candidates(o, keys.size(1), "conv_nn");
  const int64_t group = h / kv;
  const auto mask = pack_mask_groups(o.mask(), group);
  const auto mask_arg = mask.defined() ? c10::optional<at::Tensor>(mask) : c10::nullopt;
  return unfold_heads(select_and_aggregate(pack_query_groups(fold_heads(queries, h), group), keys, values, kernel,
                                           bias, o, mask_arg, {h, kv, group}, nullptr),
                      h);
}

}  // namespace detail

at::Tensor rho_weights(const at::Tensor& scores, Rho rho, double temperature) {
  TORCH_CHECK(scores.defined(), "rho_weights: scores must be a defined tensor");
  TORCH_CHECK(at::isFloatingType(scores.scalar_type()),
              "rho_weights: scores must be a floating-point tensor, got ", scores.scalar_type());
  checks::check_temperature(temperature, "rho_weights");
  return reference::rho_weights(scores, rho, temperature);
}

at::Tensor grid_coordinates(c10::IntArrayRef sizes, const at::TensorOptions& options) {
  return detail::grid_coordinates_symint(c10::fromIntArrayRefSlow(sizes), options);
}

at::Tensor draw_candidates(int64_t m, int64_t r, c10::optional<at::Generator> generator,
                           const at::Device& device) {
  return detail::draw_candidates_symint(m, r, std::move(generator), device);
}

namespace detail {

// The step is 1/(longest-1) computed in double, as a SymFloat under tracing (a plain double
// otherwise), so the coordinates, and with them the ties between equally distant neighbours, are
// the same bits as ever.
at::Tensor grid_coordinates_symint(c10::SymIntArrayRef sizes, const at::TensorOptions& options) {
  TORCH_CHECK(!sizes.empty(), "grid_coordinates: sizes must not be empty");
  c10::SymInt longest = sizes[0];
  for (const auto& s : sizes) {
    TORCH_SYM_CHECK(s.sym_ge(1), "grid_coordinates: every size must be at least 1, got ", sizes);
    longest = longest.max(s);
  }
  const c10::Scalar step = longest > 1 ? c10::Scalar(c10::SymFloat(1.0) / c10::SymFloat(longest - 1))
                                       : c10::Scalar(0.0);
  std::vector<at::Tensor> axes;
  for (const auto& s : sizes) axes.push_back(at::arange(c10::Scalar(s), options.dtype(at::kDouble)) * step);
  std::vector<at::Tensor> columns;
  for (const auto& axis : at::meshgrid(axes, "ij")) columns.push_back(axis.reshape({-1}));
  return at::stack(columns, 1).to(options);
}

at::Tensor draw_candidates_symint(const c10::SymInt& m, int64_t r, c10::optional<at::Generator> generator,
                                  const at::Device& device) {
  TORCH_SYM_CHECK(c10::SymBool(r >= 1) & m.sym_ge(r), "draw_candidates: r must be in [1, m] with m = ", m,
                  ", got r = ", r);
  // A graph of ATen operators being traced (PyTorch's proxy mode) cannot hold a generator: without
  // this, PyTorch fails deep inside its tracer ("argument of type: Generator").
  TORCH_CHECK(!generator.has_value() ||
                  !c10::impl::TorchDispatchModeTLS::get_mode(c10::impl::TorchDispatchModeKey::PROXY).has_value(),
              "random candidates (num_candidates = ", r, ") drawn from a generator cannot be traced into a graph of "
              "ATen operators (torch.onnx.export, ExportedProgram.run_decompositions, torch.compile of a layer in "
              "eval mode with fixed candidates): the graph cannot hold the generator. Use num_candidates = 0 there; "
              "torch.export.export keeps the layer op whole, draw included");
  auto drawn = at::randperm_symint(m, std::move(generator), at::TensorOptions().dtype(at::kLong));
  drawn = drawn.narrow(0, 0, r);
  return std::get<0>(reference::stable_sort(drawn, /*descending=*/false)).to(device);
}

}  // namespace detail

at::Tensor conv_nn1d(const at::Tensor& input, const at::Tensor& kernel, const at::Tensor& bias,
                     const ConvNNFuncOptions& options) {
  return detail::conv_nn_spatial(input, kernel, bias, options, 1, {});
}

at::Tensor conv_nn2d(const at::Tensor& input, const at::Tensor& kernel, const at::Tensor& bias,
                     const ConvNNFuncOptions& options) {
  return detail::conv_nn_spatial(input, kernel, bias, options, 2, {});
}

at::Tensor conv_nn3d(const at::Tensor& input, const at::Tensor& kernel, const at::Tensor& bias,
                     const ConvNNFuncOptions& options) {
  return detail::conv_nn_spatial(input, kernel, bias, options, 3, {});
}

namespace detail {

at::Tensor fold_heads(const at::Tensor& x, int64_t heads) {
  const auto split = x.unflatten(2, {heads, -1}).transpose(1, 2);  // [B,H,N,d]
  return heads == 1 ? split.squeeze(1) : merge_leading_dims(split);
}

at::Tensor unfold_heads(const at::Tensor& x, int64_t heads) {
  return x.unflatten(0, {-1, heads}).transpose(1, 2).flatten(2);
}

}  // namespace detail

}  // namespace convnn::nn::functional
