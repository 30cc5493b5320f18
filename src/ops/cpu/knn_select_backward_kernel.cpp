// Fused knn_select backward: only the K selected similarities are recomputed, on raw rows, by
// the similarity policy's pair gradient. d(queries) goes row by row; d(keys) gathers each key row's
// slots through the inverse index, in slot order: deterministic, no atomics, independent of the
// thread count. This file is compiled once per instruction set (CONVNN_CPU_ISA); see
// src/ops/cpu/isa.h.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "ops/cpu/inverse_index.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/knn_select_kernel.h"
#include "ops/kernels/similarity.h"

namespace convnn::cpu::CONVNN_CPU_ISA {
namespace {

template <typename scalar_t, typename acc_t>
void load_row(const scalar_t* src, int64_t d, acc_t* dst) {
  for (int64_t j = 0; j < d; ++j) dst[j] = static_cast<acc_t>(src[j]);
}

template <typename scalar_t, typename acc_t>
bool slot_contributes(const KnnSelectBackwardParams<scalar_t, acc_t>& p, int64_t g, int64_t i, int64_t s) {
  return static_cast<acc_t>(p.scores.at(g, i, s)) != -std::numeric_limits<acc_t>::infinity() &&
         static_cast<acc_t>(p.grad_scores.at(g, i, s)) != acc_t(0);
}

template <typename scalar_t, typename acc_t>
void store_row(const acc_t* src, int64_t d, scalar_t* dst) {
  for (int64_t j = 0; j < d; ++j) dst[j] = static_cast<scalar_t>(src[j]);
}

template <typename Policy, typename scalar_t, typename acc_t>
void grad_queries_pass(const KnnSelectBackwardParams<scalar_t, acc_t>& p) {
  const int64_t d = p.features;
  at::parallel_for(0, p.slices * p.queries_n, 16, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> q(d), key(d), out(d);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t g = row / p.queries_n, i = row % p.queries_n;
      load_row(p.queries + row * d, d, q.data());
      std::fill(out.begin(), out.end(), acc_t(0));
      for (int64_t s = 0; s < p.k; ++s) {
        if (!slot_contributes(p, g, i, s)) continue;
        load_row(p.keys + (g * p.keys_m + p.indices.at(g, i, s)) * d, d, key.data());
        Policy::add_pair_gradient(q.data(), key.data(), d,
                          static_cast<acc_t>(p.grad_scores.at(g, i, s)), true, out.data());
      }
      store_row(out.data(), d, p.grad_queries + row * d);
    }
  });
}

template <typename Policy, typename scalar_t, typename acc_t>
void grad_keys_pass(const KnnSelectBackwardParams<scalar_t, acc_t>& p) {
  const int64_t d = p.features;
  const InverseIndex inverse(p.indices, p.slices, p.queries_n, p.k, p.keys_m);
  at::parallel_for(0, p.slices * p.keys_m, 16, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> q(d), key(d), out(d);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t g = row / p.keys_m, j = row % p.keys_m;
      load_row(p.keys + row * d, d, key.data());
      std::fill(out.begin(), out.end(), acc_t(0));
      for (const int64_t* slot = inverse.begin(g, j); slot != inverse.end(g, j); ++slot) {
        const int64_t i = inverse.query(*slot), s = inverse.tap(*slot);
        if (!slot_contributes(p, g, i, s)) continue;
        load_row(p.queries + (g * p.queries_n + i) * d, d, q.data());
        Policy::add_pair_gradient(q.data(), key.data(), d,
                          static_cast<acc_t>(p.grad_scores.at(g, i, s)), false, out.data());
      }
      store_row(out.data(), d, p.grad_keys + row * d);
    }
  });
}

}  // namespace

template <typename scalar_t, typename acc_t>
void knn_select_backward(const KnnSelectBackwardParams<scalar_t, acc_t>& p) {
  kernels::dispatch_similarity(p.similarity, [&](auto policy) {
    grad_queries_pass<decltype(policy)>(p);
    grad_keys_pass<decltype(policy)>(p);
  });
}

template void knn_select_backward(const KnnSelectBackwardParams<float, float>&);
template void knn_select_backward(const KnnSelectBackwardParams<double, double>&);
template void knn_select_backward(const KnnSelectBackwardParams<c10::BFloat16, float>&);
template void knn_select_backward(const KnnSelectBackwardParams<c10::Half, float>&);

}  // namespace convnn::cpu::CONVNN_CPU_ISA
