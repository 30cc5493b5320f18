#include "convnn/nn/kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "nn/modules/sequence_forward.h"

namespace convnn::nn {

KVCache::KVCache(int64_t batch, int64_t max_length, int64_t kv_heads, int64_t key_head_dim, int64_t value_head_dim,
                 const at::TensorOptions& options) {
  TORCH_CHECK(batch >= 1 && max_length >= 1 && kv_heads >= 1 && key_head_dim >= 1 && value_head_dim >= 1,
              "KVCache: batch, max_length, kv_heads, key_head_dim and value_head_dim must be at least 1, got ", batch,
              ", ", max_length, ", ", kv_heads, ", ", key_head_dim, " and ", value_head_dim);
  keys_ = at::zeros({batch, kv_heads, max_length, key_head_dim}, options);
  values_ = at::zeros({batch, kv_heads, max_length, value_head_dim}, options);
  lengths_.assign(static_cast<size_t>(batch), 0);
}

void KVCache::reset() { std::fill(lengths_.begin(), lengths_.end(), 0); }

void KVCache::truncate(int64_t length) {
  TORCH_CHECK(length >= 0, "KVCache: truncate takes a length of at least 0, got ", length);
  for (auto& held : lengths_) held = std::min(held, length);
}

std::vector<int64_t> KVCache::append(const at::Tensor& keys, const at::Tensor& values, std::vector<int64_t> counts) {
  const auto before = lengths_;
  detail::append_to_cache(keys_, values_, lengths_, keys, values, std::move(counts));
  return before;
}

}  // namespace convnn::nn
