#include "nn/modules/sequence_forward.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <map>
#include <string>

#include "nn/functional/spatial.h"
#include "nn/functional/symint_forms.h"

namespace convnn::nn::detail {
namespace {

constexpr const char* kCache = "KVCache";

void check_no_masks(const AttentionTensors& tensors, const ConvNNAttentionOptions& o, const char* where,
                    const char* why) {
  TORCH_CHECK(!tensors.masks.attn_mask.defined() && !tensors.masks.key_padding_mask.defined() &&
                  !tensors.masks.fixed.defined(),
              where, ": takes no attn_mask, key_padding_mask or fixed mask (", why, ")");
  TORCH_CHECK(o.num_candidates() == 0, where, ": num_candidates = ", o.num_candidates(),
              " draws candidates over one sequence length; this form takes num_candidates = 0");
}

// cu_seqlens as host offsets, checked: 1-D integer [S+1], from 0 to `tokens`, non-decreasing.
std::vector<int64_t> sequence_offsets(const at::Tensor& cu_seqlens, int64_t tokens) {
  constexpr const char* where = "ConvNNAttention (packed sequences)";
  TORCH_CHECK(cu_seqlens.defined() && cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 2 &&
                  (cu_seqlens.scalar_type() == at::kLong || cu_seqlens.scalar_type() == at::kInt),
              where, ": cu_seqlens must be a 1-D int64 or int32 tensor [S+1] of the sequences' offsets (S >= 1), got ",
              cu_seqlens.defined() ? c10::str(cu_seqlens.sizes(), " ", cu_seqlens.scalar_type()) : "undefined");
  const auto host = cu_seqlens.to(at::kCPU, at::kLong).contiguous();
  std::vector<int64_t> offsets(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
  TORCH_CHECK(offsets.front() == 0 && offsets.back() == tokens, where, ": cu_seqlens must start at 0 and end at ",
              "the token count T = ", tokens, " (input.size(0)), got ", offsets.front(), " ... ", offsets.back());
  for (size_t s = 1; s < offsets.size(); ++s) {
    TORCH_CHECK(offsets[s] >= offsets[s - 1], where, ": cu_seqlens must be non-decreasing, got cu_seqlens[", s - 1,
                "] = ", offsets[s - 1], " > cu_seqlens[", s, "] = ", offsets[s]);
  }
  return offsets;
}

}  // namespace

at::Tensor attention_aggregate_packed(const ConvNNAttentionOptions& o, const at::Tensor& queries, const at::Tensor& keys,
                                      const at::Tensor& values, const AttentionTensors& tensors,
                                      const at::Tensor& cu_seqlens, bool training) {
  constexpr const char* where = "ConvNNAttention (packed sequences)";
  TORCH_CHECK(queries.dim() == 2 && keys.dim() == 2 && values.dim() == 2 && keys.size(0) == queries.size(0) &&
                  values.size(0) == queries.size(0),
              where, ": the projected queries, keys and values must be [T,C] of the same T, got ",
              queries.sizes(), ", ", keys.sizes(), " and ", values.sizes());
  check_no_masks(tensors, o, where,
                 "each query sees the keys of its own sequence, causal within it; run a padded [B,N,C] batch for "
                 "other masks");
  const auto offsets = sequence_offsets(cu_seqlens, queries.size(0));
  // The sequences' starts by length: each length runs as one [count, L, C] batch.
  std::map<int64_t, std::vector<int64_t>> starts_by_length;
  for (size_t s = 1; s < offsets.size(); ++s) {
    if (offsets[s] > offsets[s - 1]) starts_by_length[offsets[s] - offsets[s - 1]].push_back(offsets[s - 1]);
  }
  const auto index_options = at::TensorOptions().dtype(at::kLong).device(queries.device());
  std::vector<at::Tensor> rows, outputs;
  for (const auto& [length, starts] : starts_by_length) {
    const auto count = static_cast<int64_t>(starts.size());
    // A sequence shorter than k is padded to k tokens whose keys are masked: the short-row rule.
    const int64_t padded = std::max(length, o.k());
    auto token = at::tensor(starts, index_options).unsqueeze(1) + at::arange(padded, index_options).unsqueeze(0);
    const auto real = at::arange(padded, index_options) < length;
    token = at::where(real.unsqueeze(0), token, at::zeros({}, index_options)).flatten();  // padding reads token 0
    const auto gather = [&](const at::Tensor& x) { return x.index_select(0, token).view({count, padded, x.size(1)}); };
    AttentionTensors group = tensors;
    if (padded > length) group.masks.key_padding_mask = real.logical_not().unsqueeze(0).expand({count, padded});
    const auto output = attention_aggregate(o, gather(queries), gather(keys), gather(values), group, c10::nullopt,
                                            training);
    rows.push_back(token.view({count, padded}).narrow(1, 0, length).flatten());
    outputs.push_back(output.narrow(1, 0, length).flatten(0, 1));
  }
  if (outputs.empty()) {  // no token at all: the output's width from a batch of one empty sequence
    const auto none = [&](const at::Tensor& x) { return x.new_zeros({1, o.k(), x.size(1)}); };
    AttentionTensors group = tensors;
    group.masks.key_padding_mask = at::ones({1, o.k()}, index_options.dtype(at::kBool));
    const auto output = attention_aggregate(o, none(queries), none(keys), none(values), group, c10::nullopt, training);
    return output[0].narrow(0, 0, 0);
  }
  // Back to the packed order: each token's row is where its sequence's batch put it.
  const auto order = at::cat(rows);
  const auto inverse = at::empty_like(order).index_put_({order}, at::arange(order.numel(), index_options));
  return at::cat(outputs).index_select(0, inverse);
}

at::Tensor attention_forward_packed(const ConvNNAttentionOptions& o, const at::Tensor& input,
                                    const AttentionTensors& tensors, const at::Tensor& cu_seqlens, bool training) {
  TORCH_CHECK(input.defined() && input.dim() == 2 && input.size(1) == o.embed_dim(),
              "ConvNNAttention (packed sequences): input must be [T,C] (the sequences' tokens concatenated) with C = "
              "embed_dim = ", o.embed_dim(), ", got ", input.defined() ? input.sizes() : at::IntArrayRef{});
  check_input_dtype("ConvNNAttention", input, tensors.kernel);
  const auto [queries, keys, values] = project_qkv(tensors, input);
  return apply_linear(tensors.output,
                      attention_aggregate_packed(o, queries, keys, values, tensors, cu_seqlens, training));
}

std::vector<int64_t> cache_geometry(const ConvNNAttentionOptions& o) {
  const int64_t head_dim = o.embed_dim() / o.num_heads();
  return {key_value_heads(o), head_dim, head_dim};
}

std::vector<int64_t> append_to_cache(const at::Tensor& cache_keys, const at::Tensor& cache_values,
                                     std::vector<int64_t>& lengths, const at::Tensor& keys, const at::Tensor& values,
                                     std::vector<int64_t> counts) {
  TORCH_CHECK(cache_keys.defined() && cache_values.defined() && cache_keys.dim() == 4 && cache_values.dim() == 4 &&
                  cache_keys.size(0) == cache_values.size(0) && cache_keys.size(1) == cache_values.size(1) &&
                  cache_keys.size(2) == cache_values.size(2),
              kCache, ": keys and values must be [B, kv_heads, max_length, head_dim] of the same B, kv_heads and "
              "max_length");
  const int64_t batch = cache_keys.size(0), heads = cache_keys.size(1), max_length = cache_keys.size(2);
  TORCH_CHECK(static_cast<int64_t>(lengths.size()) == batch, kCache, ": lengths has ", lengths.size(),
              " entries for a batch of ", batch);
  TORCH_CHECK(keys.dim() == 3 && values.dim() == 3 && keys.size(0) == batch && values.size(0) == batch &&
                  keys.size(1) == values.size(1) && keys.size(2) == heads * cache_keys.size(3) &&
                  values.size(2) == heads * cache_values.size(3),
              kCache, ": the new keys ", keys.sizes(), " and values ", values.sizes(), " must be [B, t, C] with B = ",
              batch, " and the cache's channels (keys ", heads * cache_keys.size(3), ", values ",
              heads * cache_values.size(3), ")");
  const int64_t t = keys.size(1);
  if (counts.empty()) counts.assign(static_cast<size_t>(batch), t);
  TORCH_CHECK(static_cast<int64_t>(counts.size()) == batch, kCache, ": counts has ", counts.size(),
              " entries for a batch of ", batch, " (one per sample, or none for all ", t, " tokens)");
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t count = counts[static_cast<size_t>(b)], held = lengths[static_cast<size_t>(b)];
    TORCH_CHECK(count >= 0 && count <= t, kCache, ": counts[", b, "] = ", count, " must be in [0, t = ", t, "]");
    // The lengths come from the caller (Python's KVCache.lengths is a plain list): a negative one
    // would make narrow() count from the end and write over held tokens.
    TORCH_CHECK(held >= 0 && held <= max_length, kCache, ": lengths[", b, "] = ", held,
                " must be in [0, max_length = ", max_length, "] (the tokens sample ", b, " holds)");
    TORCH_CHECK(held + count <= max_length, kCache, ": sample ", b, " holds ", held, " tokens; ", count,
                " more would pass max_length = ", max_length, " (make the cache longer, or reset() it)");
  }
  at::NoGradGuard no_grad;  // the cache holds values, not a graph: decoding is inference
  // [B,t,heads*d] -> [B,heads,t,d], the cache's layout.
  const auto by_head = [&](const at::Tensor& x) { return x.unflatten(2, {heads, -1}).transpose(1, 2); };
  const auto new_keys = by_head(keys), new_values = by_head(values);
  const bool uniform = std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == t; }) &&
                       std::all_of(lengths.begin(), lengths.end(), [&](int64_t l) { return l == lengths[0]; });
  if (uniform) {
    cache_keys.narrow(2, lengths[0], t).copy_(new_keys);
    cache_values.narrow(2, lengths[0], t).copy_(new_values);
  } else {
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t count = counts[static_cast<size_t>(b)], held = lengths[static_cast<size_t>(b)];
      cache_keys[b].narrow(1, held, count).copy_(new_keys[b].narrow(1, 0, count));
      cache_values[b].narrow(1, held, count).copy_(new_values[b].narrow(1, 0, count));
    }
  }
  for (int64_t b = 0; b < batch; ++b) lengths[static_cast<size_t>(b)] += counts[static_cast<size_t>(b)];
  return counts;
}

at::Tensor attention_aggregate_step(const ConvNNAttentionOptions& o, const at::Tensor& queries,
                                    const AttentionTensors& tensors, const at::Tensor& cache_keys,
                                    const at::Tensor& cache_values, const std::vector<int64_t>& lengths_before,
                                    const std::vector<int64_t>& counts, bool training) {
  constexpr const char* where = "ConvNNAttention (decoding step)";
  check_no_masks(tensors, o, where, "a step is causal over the cache by construction");
  TORCH_CHECK(queries.dim() == 3 && queries.size(0) == cache_keys.size(0), where,
              ": the projected queries must be [B,t,C] with B = the cache's batch = ", cache_keys.size(0), ", got ",
              queries.sizes());
  const int64_t batch = queries.size(0), t = queries.size(1), max_length = cache_keys.size(2);
  // Keys past a sample's tokens are masked; the op needs at least k candidates (short-row rule).
  int64_t held = o.k();
  for (int64_t b = 0; b < batch; ++b) {
    held = std::max(held, lengths_before[static_cast<size_t>(b)] + counts[static_cast<size_t>(b)]);
  }
  auto func = attention_func_options(o);
  const bool shared = std::all_of(lengths_before.begin(), lengths_before.end(),
                                  [&](int64_t l) { return l == lengths_before[0]; }) &&
                      std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; });
  // No mask when every sample is at the same place and every held key is allowed (a one-token step
  // past k tokens); one [t,M] mask when every sample is at the same place; else one per (sample, head).
  if (!(shared && t == 1 && held == lengths_before[0] + counts[0])) {
    // allowed[b,i,j]: j < min(lengths_before[b] + i + 1, lengths_before[b] + counts[b]) (a row past
    // counts[b] is a padding query, computed like any other and ignored by the caller).
    const auto index = at::TensorOptions().dtype(at::kLong).device(queries.device());
    const auto before = at::tensor(lengths_before, index).view({batch, 1, 1});
    const auto after = before + at::tensor(counts, index).view({batch, 1, 1});
    const auto limit = at::minimum(before + at::arange(1, t + 1, index).view({1, t, 1}), after);
    const auto allowed = at::arange(held, index).view({1, 1, held}) < limit;  // [B,t,M]
    func.mask(shared ? allowed[0] : functional::detail::merge_leading_dims(
                                        allowed.unsqueeze(1).expand({batch, o.num_heads(), t, held})));
  }
  // The held rows of the head-major cache as [B*kv_heads, M, d] slices, read in place; a cache
  // shorter than k gets masked zero rows to make up the k candidates.
  const auto candidates = [&](const at::Tensor& cache) {
    auto held_rows = cache.narrow(2, 0, std::min(held, max_length));
    if (held > max_length) {
      held_rows = at::cat({held_rows, cache.new_zeros({batch, cache.size(1), held - max_length, cache.size(3)})}, 2);
    }
    return held_rows.flatten(0, 1);
  };
  const auto aggregated = functional::detail::conv_nn_folded_kv(queries, candidates(cache_keys),
                                                                candidates(cache_values), tensors.kernel, tensors.bias,
                                                                func);
  return at::dropout(aggregated, o.dropout(), training);
}

at::Tensor attention_aggregate_static_step(const ConvNNAttentionOptions& o, const at::Tensor& queries,
                                           const at::Tensor& keys, const at::Tensor& values,
                                           const AttentionTensors& tensors, const at::Tensor& cache_keys,
                                           const at::Tensor& cache_values, const at::Tensor& lengths, bool training) {
  constexpr const char* where = "ConvNNAttention (static decoding step)";
  check_no_masks(tensors, o, where, "a step is causal over the cache by construction");
  TORCH_CHECK(cache_keys.dim() == 4 && cache_values.dim() == 4 && cache_keys.size(0) == cache_values.size(0) &&
                  cache_keys.size(1) == cache_values.size(1) && cache_keys.size(2) == cache_values.size(2),
              kCache, ": keys and values must be [B, kv_heads, max_length, head_dim] of the same B, kv_heads and "
              "max_length");
  const int64_t batch = cache_keys.size(0), heads = cache_keys.size(1), max_length = cache_keys.size(2);
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == batch && lengths.scalar_type() == at::kLong &&
                  lengths.device() == cache_keys.device(),
              kCache, ": lengths must be an int64 [B] tensor on the cache's device with B = ", batch);
  TORCH_CHECK(queries.dim() == 3 && keys.dim() == 3 && values.dim() == 3 && queries.size(0) == batch &&
                  keys.size(0) == batch && values.size(0) == batch && keys.size(1) == queries.size(1) &&
                  values.size(1) == queries.size(1) && keys.size(2) == heads * cache_keys.size(3) &&
                  values.size(2) == heads * cache_values.size(3),
              where, ": the projected queries, keys and values must be [B,t,C] with B = the cache's batch = ", batch,
              " and the cache's channels, got ", queries.sizes(), ", ", keys.sizes(), " and ", values.sizes());
  TORCH_CHECK(max_length >= o.k(), where, ": the cache's max_length = ", max_length, " must be at least k = ", o.k(),
              " (a static step reads the whole cache)");
  const int64_t t = queries.size(1);
  const auto index = lengths.options();
  const auto positions = lengths.unsqueeze(1) + at::arange(t, index).unsqueeze(0);  // [B,t]
  // Checked on the device (no read back: a step stays graph-capturable). A negative length, which
  // only a caller's own write to lengths can make, reached scatter_ as an out-of-range index.
  at::_assert_async(lengths.ge(0).all().logical_and(positions.lt(max_length).all()),
                    c10::str(kCache, ": a step of ", t, " tokens would pass max_length = ", max_length,
                             " (make the cache longer, or reset() it), or a length is negative: each must be in "
                             "[0, max_length - t = ", max_length - t, "]"));
  {
    at::NoGradGuard no_grad;  // the cache holds values, not a graph: decoding is inference
    const auto write = [&](const at::Tensor& cache, const at::Tensor& rows) {
      const auto by_head = rows.unflatten(2, {heads, -1}).transpose(1, 2);  // [B,heads,t,d]
      cache.scatter_(2, positions.view({batch, 1, t, 1}).expand(by_head.sizes()), by_head);
    };
    write(cache_keys, keys);
    write(cache_values, values);
  }
  // allowed[b,i,j]: j <= lengths[b] + i, per (sample, head).
  const auto allowed = at::arange(max_length, index).view({1, 1, max_length}) <= positions.unsqueeze(2);
  auto func = attention_func_options(o);
  func.mask(functional::detail::merge_leading_dims(
      allowed.unsqueeze(1).expand({batch, o.num_heads(), t, max_length})));
  const auto aggregated = functional::detail::conv_nn_folded_kv(queries, cache_keys.flatten(0, 1),
                                                                cache_values.flatten(0, 1), tensors.kernel,
                                                                tensors.bias, func);
  {
    at::NoGradGuard no_grad;
    lengths.add_(t);
  }
  return at::dropout(aggregated, o.dropout(), training);
}

at::Tensor attention_forward_step(const ConvNNAttentionOptions& o, const at::Tensor& input,
                                  const AttentionTensors& tensors, KVCache& cache, const std::vector<int64_t>& counts,
                                  bool training) {
  TORCH_CHECK(input.defined() && input.dim() == 3 && input.size(0) == cache.batch() && input.size(2) == o.embed_dim(),
              "ConvNNAttention (decoding step): input must be [B,t,C] with B = the cache's batch = ", cache.batch(),
              " and C = embed_dim = ", o.embed_dim(), ", got ", input.defined() ? input.sizes() : at::IntArrayRef{});
  check_input_dtype("ConvNNAttention", input, tensors.kernel);
  const auto [queries, keys, values] = project_qkv(tensors, input);
  const auto before = cache.append(keys, values, counts);
  std::vector<int64_t> written(before.size());
  for (size_t b = 0; b < before.size(); ++b) written[b] = cache.lengths()[b] - before[b];
  return apply_linear(tensors.output, attention_aggregate_step(o, queries, tensors, cache.keys(), cache.values(),
                                                               before, written, training));
}

}  // namespace convnn::nn::detail
