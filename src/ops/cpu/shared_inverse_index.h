#pragma once
// The inverse index that one knn_attention backward on the CPU builds once for both of its steps
// that route gradients through it (the aggregation's d(values), the selection's d(keys)): they take
// the same indices, and each built its own (about 1 ms at the paper's Table 1 shape). Data only, so
// that the per-instruction-set kernel files and the CPU entry may both include it: the kernels
// read and fill the slot (ops/cpu/inverse_index.h, inverse_index_for); the attention backward opens
// it for the duration of one backward call, or of one of its tasks (ShareInverseIndex).
#include <cstdint>
#include <memory>

namespace convnn::cpu {

struct SharedInverseIndex {
  // What the index was built from: the [G,N,K] indices' data and strides, and G, N, K, M.
  const int64_t* indices = nullptr;
  int64_t stride_g = 0, stride_n = 0, stride_k = 0, g = 0, n = 0, k = 0, m = 0;
  const void* isa = nullptr;  // which instruction set's InverseIndex `index` holds
  std::shared_ptr<const void> index;
};

// Non-null while a knn_attention backward runs on this thread.
inline thread_local SharedInverseIndex* shared_inverse_index = nullptr;

// Opens a slot on this thread for the lifetime of the object, and restores the previous one after,
// whatever leaves the scope.
class ShareInverseIndex {
 public:
  ShareInverseIndex() : previous_(shared_inverse_index) { shared_inverse_index = &slot_; }
  ~ShareInverseIndex() { shared_inverse_index = previous_; }
  ShareInverseIndex(const ShareInverseIndex&) = delete;
  ShareInverseIndex& operator=(const ShareInverseIndex&) = delete;

 private:
  SharedInverseIndex slot_;
  SharedInverseIndex* previous_;
};

}  // namespace convnn::cpu
