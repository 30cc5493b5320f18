#pragma once
// The sequence cases of `convnn bench --sequence` (docs/sequences.md): ConvNNAttention as a causal
// language model's attention layer, with grouped key/value heads, against PyTorch's
// scaled_dot_product_attention (dense causal, enable_gqa) on the same projections, in one process:
// - causal attention over [B,N,C] batches at each of `tokens`, forward and forward+backward; the
//   same batch with its samples at lengths N, 3N/4, N/2, ... marked by a key_padding_mask (SDPA: the
//   causal and padding masks as one attn_mask); and those sequences packed (cu_seqlens: the cost of
//   the real tokens);
// - one decoding step (a token per sample) against a key/value cache of each of `cache_lengths`
//   tokens, forward only: ConvNNAttention::forward_step against SDPA of the new query over the same
//   cached keys and values.
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "convnn/bench/bench.h"

namespace convnn::bench {

struct SequenceBenchConfig {
  int64_t batch = 2;
  int64_t channels = 512;  // C; head_dim = C / heads
  int64_t heads = 8;
  int64_t kv_heads = 2;
  int64_t k = 8;
  std::vector<int64_t> tokens{1024, 4096, 16384};
  std::vector<int64_t> cache_lengths{4096, 65536};
  c10::ScalarType dtype = c10::ScalarType::Float;
  int64_t iters = 3;
  int64_t warmup = 1;
  uint64_t seed = 0;
  c10::Device device = c10::Device(c10::kCPU);
};

/// Throws c10::Error, one line naming the field, when a size or count is out of range.
void validate(const SequenceBenchConfig& config);

struct SequenceTiming {
  /// "causal" ([B,N,C] batch), "padded" (the batch with its samples at decreasing lengths, a
  /// key_padding_mask), "packed" (those sequences, cu_seqlens) or "decode" (one token per sample
  /// against a cache of `length` tokens).
  std::string workload;
  int64_t length = 0;  // N, or the cache's tokens
  std::string path;    // "convnn" or "sdpa"
  int64_t tokens = 0;  // the tokens: B*N, the real (unpadded) ones of padded and packed, or B for a step
  TimeStats forward;
  /// Forward and backward of one iteration (not for decode, which is inference).
  bool has_backward = false;
  TimeStats forward_backward;
};

/// Runs every case, in `tokens` then `cache_lengths` order, convnn then sdpa for each.
std::vector<SequenceTiming> run_sequence_bench(const SequenceBenchConfig& config);

}  // namespace convnn::bench
