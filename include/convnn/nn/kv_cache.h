#pragma once
// The key/value cache of a causal ConvNNAttention for incremental decoding
// (ConvNNAttentionImpl::forward_step, docs/sequences.md).
#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <vector>

namespace convnn::nn {

/// The projected keys and values a causal ConvNNAttention has seen, per sample and key/value head,
/// preallocated to max_length tokens: keys [B, kv_heads, max_length, key_head_dim] and values
/// [B, kv_heads, max_length, value_head_dim] (head-major, as the op reads them: a step reads the
/// held tokens in place, with no copy). Grouped heads shrink it. Samples may hold different numbers
/// of tokens (prompts of different lengths). A decoding step appends the new tokens' keys and values
/// (detached: a cache is for inference) and attends to everything held; past max_length it refuses
/// with the lengths named.
class KVCache {
 public:
  KVCache(int64_t batch, int64_t max_length, int64_t kv_heads, int64_t key_head_dim, int64_t value_head_dim,
          const at::TensorOptions& options);

  int64_t batch() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t max_length() const { return keys_.size(2); }
  int64_t kv_heads() const { return keys_.size(1); }
  /// Tokens held by each sample.
  const std::vector<int64_t>& lengths() const { return lengths_; }
  /// [B, kv_heads, max_length, head_dim]; rows at and past a sample's length are not yet written.
  const at::Tensor& keys() const { return keys_; }
  const at::Tensor& values() const { return values_; }
  /// Empties every sample (the storage is kept).
  void reset();
  /// Drops each sample's tokens past `length` (a rollback, as beam search or speculative decoding
  /// need); samples holding fewer keep theirs.
  void truncate(int64_t length);

  /// Writes projected keys [B, t, kv_heads * key_head_dim] and values [B, t, kv_heads *
  /// value_head_dim] after each sample's tokens: sample b takes its first counts[b] rows (all t
  /// when counts is empty). Returns the lengths before.
  std::vector<int64_t> append(const at::Tensor& keys, const at::Tensor& values, std::vector<int64_t> counts = {});

 private:
  at::Tensor keys_, values_;
  std::vector<int64_t> lengths_;
};

}  // namespace convnn::nn
