// Fused knn_select backward: only the K selected similarities are recomputed, on raw rows, by
// the similarity policy's pair gradient. d(queries) goes row by row; d(keys) gathers each key row's
// slots through the inverse index, in slot order: deterministic, no atomics, independent of the
// thread count. Where the pair gradient is a multiple of the other row (dot products) and the
// inputs are already acc_t, a row's gradient is summed over its slots in vector registers, straight
// from the input rows (sum_scaled_rows): the same terms in the same order as add_pair_gradient's
// loop, without copying each row first. This file is compiled once per
// instruction set (CONVNN_CPU_ISA); see src/ops/cpu/isa.h.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "ops/cpu/inverse_index.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/upcoming_lines.h"
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

template <typename acc_t>
struct ScaledRow {
  const acc_t* row;
  acc_t coefficient;
};

// The terms of one output row, listed before they are summed: each listed row is prefetched then,
// so that its cache lines (gathered from anywhere in the slice) are on their way before the sum
// reads them (measured at the paper's Table 1 shape: the select backward 14 % faster).
template <typename acc_t>
class ScaledRows {
 public:
  explicit ScaledRows(int64_t d) : line_bytes_(std::min<int64_t>(d * sizeof(acc_t), kPrefetchBytes)) {}
  // Room for `count` terms, and none listed.
  void start(int64_t count) {
    if (count > static_cast<int64_t>(terms_.size())) terms_.resize(count);
    size_ = 0;
  }
  void add(const acc_t* row, acc_t coefficient) {
    const char* bytes = reinterpret_cast<const char*>(row);
    for (int64_t b = 0; b < line_bytes_; b += 64) __builtin_prefetch(bytes + b);
    terms_[size_++] = {row, coefficient};
  }
  const ScaledRow<acc_t>* begin() const { return terms_.data(); }
  const ScaledRow<acc_t>* end() const { return terms_.data() + size_; }

 private:
  static constexpr int64_t kPrefetchBytes = 512;
  int64_t line_bytes_;
  int64_t size_ = 0;
  std::vector<ScaledRow<acc_t>> terms_;
};

// out[0, d) = sum over the terms, in order, of coefficient * row, from zero (add_pair_gradient's
// terms in its order); 8 vectors of features at a time stay in registers across all terms.
template <typename acc_t>
void sum_scaled_rows(const ScaledRows<acc_t>& terms, int64_t d, acc_t* out) {
  using Vec = at::vec::Vectorized<acc_t>;
  constexpr int64_t kVectors = 8;
  constexpr int64_t kChunk = kVectors * Vec::size();
  int64_t j0 = 0;
  for (; j0 + kChunk <= d; j0 += kChunk) {
    Vec acc[kVectors];
    for (auto& a : acc) a = Vec(acc_t(0));
    for (const auto& term : terms) {
      const Vec c(term.coefficient);
      for (int64_t v = 0; v < kVectors; ++v) acc[v] = acc[v] + c * Vec::loadu(term.row + j0 + v * Vec::size());
    }
    for (int64_t v = 0; v < kVectors; ++v) acc[v].store(out + j0 + v * Vec::size());
  }
  for (; j0 < d; ++j0) {
    acc_t a = 0;
    for (const auto& term : terms) a += term.coefficient * term.row[j0];
    out[j0] = a;
  }
}

template <typename Policy, typename scalar_t, typename acc_t>
constexpr bool kSumsRowsInPlace = Policy::kLinearPairGradient && std::is_same_v<scalar_t, acc_t>;

// d(queries), and each slot's coefficient into coefficients [G*N*K] (zero where the slot does not
// contribute), which d(keys) then reads with one load instead of the slot's score and gradient.
template <typename Policy, typename scalar_t, typename acc_t>
void grad_queries_in_place(const KnnSelectBackwardParams<scalar_t, acc_t>& p, acc_t* coefficients) {
  const int64_t d = p.features;
  at::parallel_for(0, p.slices * p.queries_n, 16, [&](int64_t begin, int64_t end) {
    const UpcomingLinesCursor upcoming;
    ScaledRows<acc_t> terms(d);
    for (int64_t row = begin; row < end; ++row) {
      upcoming.step();
      const int64_t g = row / p.queries_n, i = row % p.queries_n;
      terms.start(p.k);
      for (int64_t s = 0; s < p.k; ++s) {
        acc_t& coefficient = coefficients[row * p.k + s];
        coefficient = acc_t(0);
        if (!slot_contributes(p, g, i, s)) continue;
        coefficient = Policy::pair_gradient_coefficient(static_cast<acc_t>(p.grad_scores.at(g, i, s)), d);
        terms.add(p.keys + (g * p.keys_m + p.indices.at(g, i, s)) * d, coefficient);
      }
      sum_scaled_rows(terms, d, p.grad_queries + row * d);
    }
  });
}

// d(keys) from the coefficients grad_queries_in_place listed (a zero one: the slot is skipped, as
// a slot that does not contribute).
template <typename Policy, typename scalar_t, typename acc_t>
void grad_keys_in_place(const KnnSelectBackwardParams<scalar_t, acc_t>& p, const InverseIndex& inverse,
                        const acc_t* coefficients) {
  const int64_t d = p.features;
  at::parallel_for(0, p.slices * p.keys_m, 16, [&](int64_t begin, int64_t end) {
    const UpcomingLinesCursor upcoming;
    ScaledRows<acc_t> terms(d);
    for (int64_t row = begin; row < end; ++row) {
      upcoming.step();
      const int64_t g = row / p.keys_m, j = row % p.keys_m;
      terms.start(inverse.end(g, j) - inverse.begin(g, j));
      for (const int64_t* slot = inverse.begin(g, j); slot != inverse.end(g, j); ++slot) {
        const int64_t query_row = g * p.queries_n + inverse.query(*slot);
        const acc_t coefficient = coefficients[query_row * p.k + inverse.tap(*slot)];
        if (coefficient == acc_t(0)) continue;
        terms.add(p.queries + query_row * d, coefficient);
      }
      sum_scaled_rows(terms, d, p.grad_keys + row * d);
    }
  });
}

template <typename Policy, typename scalar_t, typename acc_t>
void grad_queries_pass(const KnnSelectBackwardParams<scalar_t, acc_t>& p) {
  const int64_t d = p.features;
  at::parallel_for(0, p.slices * p.queries_n, 16, [&](int64_t begin, int64_t end) {
    const UpcomingLinesCursor upcoming;
    std::vector<acc_t> q(d), key(d), out(d);
    for (int64_t row = begin; row < end; ++row) {
      upcoming.step();
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
void grad_keys_pass(const KnnSelectBackwardParams<scalar_t, acc_t>& p, const InverseIndex& inverse) {
  const int64_t d = p.features;
  at::parallel_for(0, p.slices * p.keys_m, 16, [&](int64_t begin, int64_t end) {
    const UpcomingLinesCursor upcoming;
    std::vector<acc_t> q(d), key(d), out(d);
    for (int64_t row = begin; row < end; ++row) {
      upcoming.step();
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
    using Policy = decltype(policy);
    const auto inverse = inverse_index_for(p.indices, p.slices, p.queries_n, p.k, p.keys_m);
    if constexpr (kSumsRowsInPlace<Policy, scalar_t, acc_t>) {
      Scratch<acc_t> coefficients(p.slices * p.queries_n * p.k);
      grad_queries_in_place<Policy>(p, coefficients.get());
      grad_keys_in_place<Policy>(p, *inverse, coefficients.get());
    } else {
      grad_queries_pass<Policy>(p);
      grad_keys_pass<Policy>(p, *inverse);
    }
  });
}

template void knn_select_backward(const KnnSelectBackwardParams<float, float>&);
template void knn_select_backward(const KnnSelectBackwardParams<double, double>&);
template void knn_select_backward(const KnnSelectBackwardParams<c10::BFloat16, float>&);
template void knn_select_backward(const KnnSelectBackwardParams<c10::Half, float>&);

}  // namespace convnn::cpu::CONVNN_CPU_ISA
