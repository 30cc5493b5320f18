#pragma once
// ConvNNAttention's forwards for sequence models beyond a padded [B,N,C] batch (docs/sequences.md):
// packed variable-length batches and incremental decoding with a key/value cache. The one
// implementation that the C++ module and the layer ops Python calls share (as layer_forward.h).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "convnn/nn/kv_cache.h"
#include "convnn/nn/options/convnn.h"
#include "nn/modules/layer_forward.h"

namespace convnn::nn::detail {

// A packed batch of variable-length sequences, as FlashAttention's varlen functions take them:
// the projected tokens [T,C] of S sequences concatenated, and cu_seqlens [S+1] (int64 or int32, any
// device) their offsets: 0 = cu_seqlens[0] <= ... <= cu_seqlens[S] = T. Each query selects among the
// keys of its own sequence only; the causal option applies within each sequence. Equal to running
// each sequence alone, at the cost of the real tokens: sequences of one length run as one batch,
// one call per distinct length. A sequence shorter than k follows the short-row rule (its remaining
// slots weigh 0), as in a padded batch. The call's masks and the options' fixed mask must be absent
// (a sequence's keys are its own), and random candidates are refused (a draw over one length).
at::Tensor attention_aggregate_packed(const ConvNNAttentionOptions& options, const at::Tensor& queries,
                                      const at::Tensor& keys, const at::Tensor& values,
                                      const AttentionTensors& tensors, const at::Tensor& cu_seqlens, bool training);
at::Tensor attention_forward_packed(const ConvNNAttentionOptions& options, const at::Tensor& input,
                                    const AttentionTensors& tensors, const at::Tensor& cu_seqlens, bool training);

// A ConvNNAttention's cache per sample: {kv_heads, key_head_dim, value_head_dim}.
std::vector<int64_t> cache_geometry(const ConvNNAttentionOptions& options);

// The cache's rule on plain tensors, shared by KVCache and the layer op Python calls: writes keys
// [B,t,kv_heads*dk] and values [B,t,kv_heads*dv] (detached) after each sample's `lengths[b]` tokens
// of cache_keys [B,kv_heads,L,dk] and cache_values [B,kv_heads,L,dv], sample b taking its first counts[b] rows (all t when counts is
// empty), and adds them to `lengths`. Returns the counts. Refuses, with the sample named, a write
// past L.
std::vector<int64_t> append_to_cache(const at::Tensor& cache_keys, const at::Tensor& cache_values,
                                     std::vector<int64_t>& lengths, const at::Tensor& keys, const at::Tensor& values,
                                     std::vector<int64_t> counts);

// One decoding step of a ConvNNAttention, always causal, after the new tokens' keys and values were
// appended (append_to_cache): new token i of sample b (queries [B,t,C]) selects among the sample's
// cached keys up to and including itself, positions < lengths_before[b] + i + 1. Equal to the rows
// of the full causal forward on the same prefix. The call's masks, a fixed mask and random
// candidates are refused.
at::Tensor attention_aggregate_step(const ConvNNAttentionOptions& options, const at::Tensor& queries,
                                    const AttentionTensors& tensors, const at::Tensor& cache_keys,
                                    const at::Tensor& cache_values, const std::vector<int64_t>& lengths_before,
                                    const std::vector<int64_t>& counts, bool training);
// A decoding step on a static cache, for torch.compile and CUDA graphs: every sample advances by
// the same t tokens, the held tokens are `lengths` (int64 [B] on the cache's device, advanced in
// place by t), and the step reads the whole cache [B,kv_heads,L,d] with a mask j < lengths[b] + i + 1,
// so no shape and no host value depends on the lengths: a compiled step compiles once, and a CUDA
// graph can replay it. Cost O(L·d) per query row (the cache's length L, not the held M). A write past
// L fails through a device assertion (the message names max_length).
at::Tensor attention_aggregate_static_step(const ConvNNAttentionOptions& options, const at::Tensor& queries,
                                           const at::Tensor& keys, const at::Tensor& values,
                                           const AttentionTensors& tensors, const at::Tensor& cache_keys,
                                           const at::Tensor& cache_values, const at::Tensor& lengths, bool training);

at::Tensor attention_forward_step(const ConvNNAttentionOptions& options, const at::Tensor& input,
                                  const AttentionTensors& tensors, KVCache& cache, const std::vector<int64_t>& counts,
                                  bool training);

}  // namespace convnn::nn::detail
