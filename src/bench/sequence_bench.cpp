#include "convnn/bench/sequence_bench.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <functional>
#include <numeric>

#include "convnn/nn/kv_cache.h"
#include "convnn/nn/modules/convnn.h"

namespace convnn::bench {
namespace {

using Clock = std::chrono::steady_clock;

SequenceTiming row_of(const char* workload, int64_t length, const char* path, int64_t tokens) {
  SequenceTiming row;
  row.workload = workload;
  row.length = length;
  row.path = path;
  row.tokens = tokens;
  return row;
}

// Median and spread of `iters` timed runs of `work` after `warmup` untimed ones.
TimeStats time_runs(const SequenceBenchConfig& c, const std::function<void()>& work) {
  std::vector<double> samples;
  for (int64_t i = 0; i < c.warmup + c.iters; ++i) {
    synchronize(c.device);
    const auto start = Clock::now();
    work();
    synchronize(c.device);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (i >= c.warmup) samples.push_back(ms);
  }
  return summarize(std::move(samples));
}

// [B,N,heads*d] -> [B,heads,N,d]
at::Tensor split_heads(const at::Tensor& x, int64_t heads) {
  return x.unflatten(2, {heads, -1}).transpose(1, 2);
}

// The dense baseline on the layer's own weights: its projections, SDPA, its output projection.
// queries [B,H,N,d] against keys and values [B,Hkv,M,d]; enable_gqa reads the shared heads.
at::Tensor sdpa_heads(const nn::ConvNNAttentionImpl& layer, const at::Tensor& queries, const at::Tensor& keys,
                      const at::Tensor& values, bool causal, const at::Tensor& attn_mask = {}) {
  const auto out = at::scaled_dot_product_attention(
      queries, keys, values, attn_mask.defined() ? c10::optional<at::Tensor>(attn_mask) : c10::nullopt, 0.0, causal,
      c10::nullopt, /*enable_gqa=*/keys.size(1) != queries.size(1));
  return at::linear(out.transpose(1, 2).flatten(2), layer.output_projection->weight);
}

nn::ConvNNAttention make_layer(const SequenceBenchConfig& c) {
  at::manual_seed(c.seed);
  nn::ConvNNAttention layer(
      nn::ConvNNAttentionOptions(c.channels, c.heads, c.k).num_kv_heads(c.kv_heads).causal(true));
  layer->to(c.device, c.dtype);
  return layer;
}

// Forward and forward+backward of `forward` (its output's backward against `grad`).
void time_training(const SequenceBenchConfig& c, SequenceTiming& timing, const std::function<at::Tensor()>& forward,
                   const at::Tensor& grad, nn::ConvNNAttentionImpl& layer) {
  timing.forward = time_runs(c, [&] {
    at::NoGradGuard no_grad;
    forward();
  });
  timing.has_backward = true;
  timing.forward_backward = time_runs(c, [&] {
    layer.zero_grad();
    forward().backward(grad);
  });
}

// Both paths' projections of x: queries [B,H,N,d], keys and values [B,Hkv,N,d].
struct HeadProjections {
  at::Tensor queries, keys, values;
};
HeadProjections project_heads(const nn::ConvNNAttentionImpl& layer, const at::Tensor& x, const SequenceBenchConfig& c) {
  return {split_heads(at::linear(x, layer.query_projection->weight), c.heads),
          split_heads(at::linear(x, layer.key_projection->weight), c.kv_heads),
          split_heads(at::linear(x, layer.value_projection->weight), c.kv_heads)};
}

// The batch x with its samples' tails as padding (key_padding_mask, true = padding): convnn's layer
// takes the mask as it is; SDPA takes it with the causal mask as one [B,1,N,N] attn_mask, built in
// each call as a user's code builds it (SDPA's is_causal takes no other mask).
void padded_cases(const SequenceBenchConfig& c, int64_t n, const std::vector<int64_t>& lengths, const at::Tensor& x,
                  const at::Tensor& grad, nn::ConvNNAttentionImpl& layer, std::vector<SequenceTiming>& out) {
  const auto positions = at::arange(n, at::TensorOptions().dtype(at::kLong).device(c.device));
  const auto padding = positions.unsqueeze(0) >= at::tensor(lengths).to(c.device).unsqueeze(1);  // [B,N]
  const int64_t real = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  auto convnn = row_of("padded", n, "convnn", real);
  time_training(c, convnn, [&] { return layer.forward(x, {}, padding); }, grad, layer);
  out.push_back(convnn);

  const int64_t group = c.heads / c.kv_heads;
  auto sdpa = row_of("padded", n, "sdpa", real);
  time_training(
      c, sdpa,
      [&] {
        const auto p = project_heads(layer, x, c);
        const auto causal = positions.unsqueeze(0) <= positions.unsqueeze(1);                          // [N,N]
        const auto allowed = causal.unsqueeze(0).logical_and(padding.logical_not().unsqueeze(1)).unsqueeze(1);
        return sdpa_heads(layer, p.queries, p.keys.repeat_interleave(group, 1), p.values.repeat_interleave(group, 1),
                          false, allowed);
      },
      grad, layer);
  out.push_back(sdpa);
}

void causal_cases(const SequenceBenchConfig& c, int64_t n, at::Generator& gen, std::vector<SequenceTiming>& out) {
  const auto options = at::TensorOptions().dtype(c.dtype).device(c.device);
  const auto drawn = at::TensorOptions().dtype(at::kFloat);
  auto layer = make_layer(c);
  const auto x = at::randn({c.batch, n, c.channels}, gen, drawn).to(options);
  const auto grad = at::randn({c.batch, n, c.channels}, gen, drawn).to(options);
  auto convnn = row_of("causal", n, "convnn", c.batch * n);
  time_training(c, convnn, [&] { return layer(x); }, grad, *layer);
  out.push_back(convnn);

  // The dense baseline with every key/value head repeated per query head: PyTorch's CPU flash
  // kernel takes equal head counts (with enable_gqa it falls back to the [B,H,N,N] math path).
  const int64_t group = c.heads / c.kv_heads;
  auto sdpa = row_of("causal", n, "sdpa", c.batch * n);
  time_training(
      c, sdpa,
      [&] {
        const auto p = project_heads(*layer, x, c);
        return sdpa_heads(*layer, p.queries, p.keys.repeat_interleave(group, 1), p.values.repeat_interleave(group, 1),
                          true);
      },
      grad, *layer);
  out.push_back(sdpa);

  // The samples at lengths n, 3n/4, n/2, ... (at least K): padded to n with a key_padding_mask, then
  // packed.
  std::vector<int64_t> lengths;
  for (int64_t b = 0; b < c.batch; ++b) lengths.push_back(std::max<int64_t>(c.k, n - b * n / 4));
  padded_cases(c, n, lengths, x, grad, *layer, out);

  std::vector<int64_t> offsets{0};
  for (const int64_t length : lengths) offsets.push_back(offsets.back() + length);
  const int64_t total = offsets.back();
  const auto packed = at::randn({total, c.channels}, gen, drawn).to(options);
  const auto packed_grad = at::randn({total, c.channels}, gen, drawn).to(options);
  const auto cu_seqlens = at::tensor(offsets).to(c.device);
  auto varlen = row_of("packed", n, "convnn", total);
  time_training(c, varlen, [&] { return layer->forward_packed(packed, cu_seqlens); }, packed_grad, *layer);
  out.push_back(varlen);
}

void decode_cases(const SequenceBenchConfig& c, int64_t m, at::Generator& gen, std::vector<SequenceTiming>& out) {
  const auto options = at::TensorOptions().dtype(c.dtype).device(c.device);
  const auto drawn = at::TensorOptions().dtype(at::kFloat);
  auto layer = make_layer(c);
  layer->eval();
  at::NoGradGuard no_grad;
  // A cache of m - 1 random tokens; each timed step adds the m-th and is rolled back.
  auto cache = layer->make_cache(c.batch, m);
  const int64_t kv_channels = layer->key_projection->weight.size(0);
  cache.append(at::randn({c.batch, m - 1, kv_channels}, gen, drawn).to(options),
               at::randn({c.batch, m - 1, kv_channels}, gen, drawn).to(options));
  const auto token = at::randn({c.batch, 1, c.channels}, gen, drawn).to(options);
  auto convnn = row_of("decode", m, "convnn", c.batch);
  convnn.forward = time_runs(c, [&] {
    layer->forward_step(token, cache);
    cache.truncate(m - 1);
  });
  out.push_back(convnn);

  // SDPA's step over the same head-major cache: project the token, write its key and value at
  // position m - 1, attend over the m positions (one query: no mask).
  auto sdpa = row_of("decode", m, "sdpa", c.batch);
  sdpa.forward = time_runs(c, [&] {
    const auto q = split_heads(at::linear(token, layer->query_projection->weight), c.heads);
    cache.keys().narrow(2, m - 1, 1).copy_(split_heads(at::linear(token, layer->key_projection->weight), c.kv_heads));
    cache.values().narrow(2, m - 1, 1).copy_(
        split_heads(at::linear(token, layer->value_projection->weight), c.kv_heads));
    sdpa_heads(*layer, q, cache.keys(), cache.values(), false);
  });
  out.push_back(sdpa);
}

}  // namespace

void validate(const SequenceBenchConfig& c) {
  TORCH_CHECK(c.batch >= 1, "bench --sequence: batch must be at least 1, got ", c.batch);
  TORCH_CHECK(c.heads >= 1 && c.channels >= 1 && c.channels % c.heads == 0, "bench --sequence: heads = ", c.heads,
              " must be at least 1 and divide channels = ", c.channels);
  TORCH_CHECK(c.kv_heads >= 1 && c.heads % c.kv_heads == 0, "bench --sequence: kv_heads = ", c.kv_heads,
              " must be at least 1 and divide heads = ", c.heads);
  TORCH_CHECK(c.k >= 1, "bench --sequence: k must be at least 1, got ", c.k);
  for (const int64_t n : c.tokens) {
    TORCH_CHECK(n >= c.k, "bench --sequence: every sequence length must be at least k = ", c.k, ", got ", n);
  }
  for (const int64_t m : c.cache_lengths) {
    TORCH_CHECK(m >= 2, "bench --sequence: every cache length must be at least 2, got ", m);
  }
  TORCH_CHECK(c.iters >= 1 && c.warmup >= 0, "bench --sequence: iters must be at least 1 and warmup at least 0, got ",
              c.iters, " and ", c.warmup);
  TORCH_CHECK(c.device.is_cpu() || c.device.has_index(), "bench --sequence: device ", c.device.str(),
              " must have an index (convnn::resolve_device gives one)");
}

std::vector<SequenceTiming> run_sequence_bench(const SequenceBenchConfig& c) {
  validate(c);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(c.seed);
  std::vector<SequenceTiming> out;
  for (const int64_t n : c.tokens) causal_cases(c, n, gen, out);
  for (const int64_t m : c.cache_lengths) decode_cases(c, m, gen, out);
  return out;
}

}  // namespace convnn::bench
