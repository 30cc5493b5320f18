#pragma once
// Scratch memory and the inverse index shared by the CPU kernels. Included only by kernel files,
// so it lives in the per-instruction-set namespace (see ops/cpu/isa.h).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>

#include "ops/cpu/shared_inverse_index.h"
#include "ops/kernels/views.h"

namespace convnn::cpu::CONVNN_CPU_ISA {

using kernels::RowsView;
using kernels::SlotsView;

// Uninitialised, 64-byte aligned scratch memory (aligned so that GEMM micro-kernels see the same
// alignment on every call).
template <typename T>
class Scratch {
 public:
  explicit Scratch(int64_t n)
      : data_(n > 0 ? static_cast<T*>(::operator new(sizeof(T) * n, std::align_val_t{64}))
                    : nullptr) {}
  ~Scratch() {
    if (data_ != nullptr) ::operator delete(data_, std::align_val_t{64});
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return data_; }

 private:
  T* data_;
};

// For slice g and value row j, the slots (i,k) with indices[g,i,k] == j, in increasing (i,k) order.
// Built per slice by a stable counting sort, so every gradient gathered through it is summed in
// the same order on every run. A slot is stored as (i << shift) | k, which keeps that order and
// decodes without a division.
class InverseIndex {
 public:
  // indices [G,N,K], every entry in [0,M).
  InverseIndex(const SlotsView<const int64_t>& indices, int64_t g, int64_t n, int64_t k, int64_t m)
      : m_(m), slots_per_slice_(n * k), offsets_(g * (m + 1)), slots_(g * n * k) {
    const struct { int64_t g, n, k, m; } s{g, n, k, m};
    while ((int64_t{1} << shift_) < s.k) ++shift_;
    at::parallel_for(0, s.g, 1, [&](int64_t begin, int64_t end) {
      Scratch<int64_t> cursor(s.m);
      for (int64_t g = begin; g < end; ++g) {
        int64_t* offsets = offsets_.get() + g * (s.m + 1);
        int64_t* slots = slots_.get() + g * slots_per_slice_;
        std::fill_n(offsets, s.m + 1, 0);
        for (int64_t i = 0; i < s.n; ++i) {
          for (int64_t k = 0; k < s.k; ++k) ++offsets[indices.at(g, i, k) + 1];
        }
        for (int64_t j = 0; j < s.m; ++j) offsets[j + 1] += offsets[j];
        std::copy_n(offsets, s.m, cursor.get());
        for (int64_t i = 0; i < s.n; ++i) {
          for (int64_t k = 0; k < s.k; ++k) {
            slots[cursor.get()[indices.at(g, i, k)]++] = (i << shift_) | k;
          }
        }
      }
    });
  }

  const int64_t* begin(int64_t g, int64_t j) const {
    return slots_.get() + g * slots_per_slice_ + offsets_.get()[g * (m_ + 1) + j];
  }
  const int64_t* end(int64_t g, int64_t j) const {
    return slots_.get() + g * slots_per_slice_ + offsets_.get()[g * (m_ + 1) + j + 1];
  }
  int64_t query(int64_t slot) const { return slot >> shift_; }
  int64_t tap(int64_t slot) const { return slot & ((int64_t{1} << shift_) - 1); }

 private:
  int64_t m_;
  int64_t slots_per_slice_;
  int shift_ = 0;
  Scratch<int64_t> offsets_;  // [G, M+1]
  Scratch<int64_t> slots_;    // [G, N*K]
};

// The inverse index of `indices`: the one the running knn_attention backward already built for
// these indices (shared_inverse_index.h), else a new one, which that backward's other step then
// reads.
inline std::shared_ptr<const InverseIndex> inverse_index_for(const SlotsView<const int64_t>& indices, int64_t g,
                                                             int64_t n, int64_t k, int64_t m) {
  static const char kThisIsa = 0;  // one per instruction set: the namespaces differ
  SharedInverseIndex* shared = shared_inverse_index;
  if (shared != nullptr && shared->index != nullptr && shared->isa == &kThisIsa &&
      shared->indices == indices.data && shared->stride_g == indices.stride_g &&
      shared->stride_n == indices.stride_n && shared->stride_k == indices.stride_k && shared->g == g &&
      shared->n == n && shared->k == k && shared->m == m) {
    return std::static_pointer_cast<const InverseIndex>(shared->index);
  }
  auto built = std::make_shared<const InverseIndex>(indices, g, n, k, m);
  if (shared != nullptr) {
    *shared = {indices.data, indices.stride_g, indices.stride_n, indices.stride_k, g, n, k, m, &kThisIsa, built};
  }
  return built;
}

}  // namespace convnn::cpu::CONVNN_CPU_ISA
