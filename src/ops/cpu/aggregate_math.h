#pragma once
// The arithmetic shared by the fused knn_aggregate kernels (knn_aggregate_forward_kernel.cpp and
// knn_aggregate_backward_kernel.cpp): vector primitives on opmath rows, conversions between
// storage and opmath rows, the register-blocked sum of scaled products (depthwise rows, value-side
// gathers, d(values) through the inverse index), the blocked single-threaded tile GEMM, the work
// decomposition of the standard paths and the kernel layouts.
//
// Included only by kernel files, so it lives in the per-instruction-set namespace (see
// ops/cpu/isa.h), and in an anonymous namespace inside it, as each kernel file's own helpers do.
// Every summation order here is a function of the shapes only, never of the thread count.
//
// GEMMs run on fp32 (or fp64) tiles, single-threaded inside the parallel loops: float tiles use
// at::native::cpublas::brgemm (oneDNN's batch-reduce micro-kernel where the CPU has one, BLAS
// otherwise); double, the test precision, uses a plain vectorised loop.
#include <ATen/OpMathType.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ops/cpu/knn_aggregate_kernel.h"

namespace convnn::cpu::CONVNN_CPU_ISA {
namespace {

// Minimum multiply-adds per parallel task, so that small problems do not pay for threading.
constexpr int64_t kGrainWork = 1 << 15;
// A thread's GEMM tiles ([rows, K*max(C,C')] each) should stay within L2.
constexpr int64_t kTileBytes = 512 << 10;
// Long sums are split into blocks whose results are then added: a GEMM sums at most kGemmBlock
// products in one chain (a kernel-gradient chunk likewise sums at most kRowBlock rows in one
// chain, aggregate_reduction.h). A single chain over a reduction of length L loses accuracy like L
// (BLAS libraries block for the same reason); blocking keeps the error at or below that of the
// reference path's BLAS calls.
constexpr int64_t kGemmBlock = 64;

[[maybe_unused]] int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Grain of a parallel loop over rows that cost `work_per_row` multiply-adds each: kGrainWork
// multiply-adds per task at least.
[[maybe_unused]] int64_t row_grain(int64_t work_per_row) {
  return std::max<int64_t>(1, kGrainWork / std::max<int64_t>(1, work_per_row));
}

// ---- Vector primitives on opmath rows (full vectors, then a scalar tail) -----------------------

template <typename T>
using Vec = at::vec::Vectorized<T>;

// y += a * x
template <typename T>
void axpy(int64_t n, T a, const T* x, T* y) {
  const Vec<T> av(a);
  int64_t c = 0;
  for (; c + Vec<T>::size() <= n; c += Vec<T>::size()) {
    at::vec::fmadd(av, Vec<T>::loadu(x + c), Vec<T>::loadu(y + c)).store(y + c);
  }
  for (; c < n; ++c) y[c] += a * x[c];
}

// y = a * x
template <typename T>
void scale_copy(int64_t n, T a, const T* x, T* y) {
  const Vec<T> av(a);
  int64_t c = 0;
  for (; c + Vec<T>::size() <= n; c += Vec<T>::size()) (av * Vec<T>::loadu(x + c)).store(y + c);
  for (; c < n; ++c) y[c] = a * x[c];
}

// Horizontal sum of a vector accumulator, by a fixed shuffle tree.
template <typename T>
T reduce_lanes(const Vec<T>& acc) {
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
  return at::vec::vec_reduce_all<T>([](const Vec<T>& x, const Vec<T>& y) { return x + y; }, acc);
#else
  // Without SIMD shuffles, vec_reduce_all rebuilds a vector per lane: sum the lanes directly.
  std::array<T, Vec<T>::size()> lanes;
  acc.store(lanes.data());
  T sum = 0;
  for (const T lane : lanes) sum += lane;
  return sum;
#endif
}

// sum_c x[c] * y[c]
template <typename T>
T dot(int64_t n, const T* x, const T* y) {
  Vec<T> acc(T(0));
  int64_t c = 0;
  for (; c + Vec<T>::size() <= n; c += Vec<T>::size()) {
    acc = at::vec::fmadd(Vec<T>::loadu(x + c), Vec<T>::loadu(y + c), acc);
  }
  T sum = reduce_lanes(acc);
  for (; c < n; ++c) sum += x[c] * y[c];
  return sum;
}

// Returns sum_c u[c] * x[c] * y[c] and adds a * x * y to acc: the two uses of the product x * y
// in the depthwise backward share its loads. The sum runs as two chains (even and odd vectors),
// added at the end, so that each step need not wait for the last (measured: the depthwise backward
// 7 % faster at the paper's Table 1 shape).
template <typename T>
T dot3_and_accumulate(int64_t n, const T* u, const T* x, const T* y, T a, T* acc) {
  constexpr int64_t kWidth = Vec<T>::size();
  const Vec<T> av(a);
  const auto step = [&](int64_t c, Vec<T>& sum) {
    const Vec<T> xy = Vec<T>::loadu(x + c) * Vec<T>::loadu(y + c);
    sum = at::vec::fmadd(Vec<T>::loadu(u + c), xy, sum);
    at::vec::fmadd(av, xy, Vec<T>::loadu(acc + c)).store(acc + c);
  };
  Vec<T> even(T(0)), odd(T(0));
  int64_t c = 0;
  for (; c + 2 * kWidth <= n; c += 2 * kWidth) {
    step(c, even);
    step(c + kWidth, odd);
  }
  even = even + odd;
  for (; c + kWidth <= n; c += kWidth) step(c, even);
  T sum = reduce_lanes(even);
  for (; c < n; ++c) {
    const T xy = x[c] * y[c];
    sum += u[c] * xy;
    acc[c] += a * xy;
  }
  return sum;
}

// ---- Prefetching gathered rows ------------------------------------------------------------------

// Gathers read rows from anywhere in a slice, which the hardware prefetchers cannot foresee: a pass
// asks for the rows of the row kGatherAhead rows on, so that they arrive while it works (measured
// at the paper's Table 1 shape: the depthwise backward 4 % faster).
constexpr int64_t kGatherAhead = 2;

// Asks for the cache lines of the first `bytes` bytes of `row` (at most 512: what the next terms
// read first).
inline void prefetch_row(const void* row, int64_t bytes) {
  const char* line = static_cast<const char*>(row);
  const int64_t end = std::min<int64_t>(bytes, 512);
  for (int64_t b = 0; b < end; b += 64) __builtin_prefetch(line + b);
}

// The rows rows.row(g, indices[g, i, k]) for every k of flat query row r = g * n + i, when r < total.
template <typename scalar_t>
void prefetch_selected_rows(const kernels::RowsView<const scalar_t>& rows,
                            const kernels::SlotsView<const int64_t>& indices, int64_t r, int64_t total,
                            int64_t n, int64_t k_taps, int64_t width) {
  if (r >= total) return;
  const int64_t g = r / n, i = r % n;
  for (int64_t k = 0; k < k_taps; ++k) prefetch_row(rows.row(g, indices.at(g, i, k)), width * sizeof(scalar_t));
}

// ---- Conversions between storage rows and opmath rows -------------------------------------------

// The row as opmath values: the row itself when the storage type already is opmath, else a
// widened copy in `scratch` (bfloat16 and half).
template <typename scalar_t, typename T>
const T* opmath_row(const scalar_t* row, int64_t n, T* scratch) {
  if constexpr (std::is_same_v<scalar_t, T>) {
    return row;
  } else {
    at::vec::convert(row, scratch, n);
    return scratch;
  }
}

template <typename scalar_t, typename T>
void copy_row(const scalar_t* src, int64_t n, T* dst) {
  if constexpr (std::is_same_v<scalar_t, T>) {
    std::memcpy(dst, src, sizeof(T) * n);
  } else {
    at::vec::convert(src, dst, n);
  }
}

template <typename T, typename scalar_t>
void store_row(const T* src, int64_t n, scalar_t* dst) {
  if constexpr (std::is_same_v<scalar_t, T>) {
    std::memcpy(dst, src, sizeof(T) * n);
  } else {
    at::vec::convert(src, dst, n);
  }
}

// ---- Register-blocked sum of scaled products ----------------------------------------------------

// out[c] = init[c] + sum_t a_t * u_t[c] * x_t[c] over the terms t = 0..terms-1 in order (init may
// be null: zero; without kScaled, u_t = 1). Channels go in blocks of kBlockVectors vectors whose
// accumulators stay in registers while the terms stream by, instead of a load and a store of the
// output per term. term(t, c0, width, scratch) returns {a_t, u_t + c0, x_t + c0} as opmath values;
// it may widen x_t[c0, c0 + width) into `scratch`.
template <bool kScaled, typename T, typename Term>
void sum_of_products(int64_t n, const T* init, int64_t terms, const Term& term, T* out) {
  constexpr int64_t kWidth = Vec<T>::size();
  constexpr int64_t kBlockVectors = 8;
  constexpr int64_t kBlock = kBlockVectors * kWidth;
  alignas(64) T scratch[kBlock];
  int64_t c0 = 0;
  for (; c0 + kBlock <= n; c0 += kBlock) {
    Vec<T> acc[kBlockVectors];
    for (int64_t b = 0; b < kBlockVectors; ++b) {
      acc[b] = init ? Vec<T>::loadu(init + c0 + b * kWidth) : Vec<T>(T(0));
    }
    for (int64_t t = 0; t < terms; ++t) {
      const auto [a, u, x] = term(t, c0, kBlock, scratch);
      const Vec<T> av(a);
      for (int64_t b = 0; b < kBlockVectors; ++b) {
        const Vec<T> scale = kScaled ? av * Vec<T>::loadu(u + b * kWidth) : av;
        acc[b] = at::vec::fmadd(scale, Vec<T>::loadu(x + b * kWidth), acc[b]);
      }
    }
    for (int64_t b = 0; b < kBlockVectors; ++b) acc[b].store(out + c0 + b * kWidth);
  }
  if (c0 == n) return;
  const int64_t width = n - c0;
  if (width < kWidth) {
    // Fewer channels than one vector (small layers): partial vector loads go through memcpy, so
    // scalar accumulators are faster here.
    T acc[kWidth];
    for (int64_t c = 0; c < width; ++c) acc[c] = init ? init[c0 + c] : T(0);
    for (int64_t t = 0; t < terms; ++t) {
      const auto [a, u, x] = term(t, c0, width, scratch);
      for (int64_t c = 0; c < width; ++c) acc[c] += (kScaled ? a * u[c] : a) * x[c];
    }
    std::copy_n(acc, width, out + c0);
    return;
  }
  // The ragged last block: the same arithmetic on partial vectors (lanes past the end are
  // never stored).
  const int64_t vectors = ceil_div(width, kWidth);
  Vec<T> acc[kBlockVectors];
  for (int64_t b = 0; b < vectors; ++b) {
    const int64_t count = std::min(kWidth, width - b * kWidth);
    acc[b] = init ? Vec<T>::loadu(init + c0 + b * kWidth, count) : Vec<T>(T(0));
  }
  for (int64_t t = 0; t < terms; ++t) {
    const auto [a, u, x] = term(t, c0, width, scratch);
    const Vec<T> av(a);
    for (int64_t b = 0; b < vectors; ++b) {
      const int64_t count = std::min(kWidth, width - b * kWidth);
      const Vec<T> scale = kScaled ? av * Vec<T>::loadu(u + b * kWidth, count) : av;
      acc[b] = at::vec::fmadd(scale, Vec<T>::loadu(x + b * kWidth, count), acc[b]);
    }
  }
  for (int64_t b = 0; b < vectors; ++b) {
    acc[b].store(out + c0 + b * kWidth, std::min(kWidth, width - b * kWidth));
  }
}

// sum_of_products into an output row: float rows accumulate in place, narrower ones go through
// `buffer` and are rounded once at the end.
template <bool kScaled, typename scalar_t, typename T, typename Term>
void sum_of_products_into(int64_t n, const T* init, int64_t terms, const Term& term, T* buffer,
                          scalar_t* out) {
  if constexpr (std::is_same_v<scalar_t, T>) {
    sum_of_products<kScaled>(n, init, terms, term, out);
  } else {
    sum_of_products<kScaled>(n, init, terms, term, buffer);
    store_row(buffer, n, out);
  }
}

// ---- Single-threaded tile GEMM ------------------------------------------------------------------

// c[m,n] = a[m,k] @ b[k,n], row-major with leading dimensions, k >= 1. Called from inside the
// parallel loops on thread-local tiles; the summation order depends on the shapes only.
[[maybe_unused]] void gemm_chain(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                 const float* b, int64_t ldb, float* c, int64_t ldc) {
  at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, /*add_C=*/false, a, b, c, /*is_vnni=*/false);
}

[[maybe_unused]] void gemm_chain(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
                                 const double* b, int64_t ldb, double* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    double* c_row = c + i * ldc;
    std::fill_n(c_row, n, 0.0);
    for (int64_t p = 0; p < k; ++p) axpy(n, a[i * lda + p], b + p * ldb, c_row);
  }
}

// c[m,n] (ld n) = a[m,k] @ b[k,n], summing blocks of kGemmBlock along k separately and adding the
// block products in order. `block` is scratch for m*n values.
template <typename T>
void tile_gemm(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb,
               T* c, T* block) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill_n(c, m * n, T(0));
    return;
  }
  gemm_chain(m, n, std::min(k, kGemmBlock), a, lda, b, ldb, c, n);
  for (int64_t p = kGemmBlock; p < k; p += kGemmBlock) {
    gemm_chain(m, n, std::min(k - p, kGemmBlock), a + p, lda, b + p * ldb, ldb, block, n);
    axpy(m * n, T(1), block, c);
  }
}

// ---- Work decomposition (a function of the shapes only, never of the thread count) --------------

// Query (or value) rows per GEMM tile of the standard path: as many as fit the tile budget, at
// least 8 to keep the GEMM efficient, at most 128, and never more than the problem has (a small
// problem, such as one slice of the fused attention, should not allocate and fault in a large
// tile).
[[maybe_unused]] int64_t standard_tile_rows(const AggregateSizes& s, int64_t elem_bytes) {
  const int64_t row_bytes = std::max<int64_t>(1, s.k * std::max(s.c, s.c_out)) * elem_bytes;
  const int64_t rows = std::max<int64_t>(1, s.g * std::max(s.n, s.m));
  return std::min(rows, std::clamp<int64_t>(kTileBytes / row_bytes, 8, 128));
}

// The standard kernel's value side. With fewer candidates than queries (M < N: random
// candidates), passing every candidate row through every tap once, U[g,j,k,:] = W_k v[g,j], costs
// M*K*C*C' instead of the query side's N*K*C*C', and what is left per query is a depthwise-like
// gather, y = bias + sum_k w_k U[I_k,k]. The backward mirrors it: d(kernel) = sum over value rows
// of Z^T v and d(weights)[i,k] = <dy_i, U[I_k,k]>. U ([G*M, K*C'] in opmath) is the one
// problem-sized buffer, so the value side is used only while it stays below kTransformedBytes.
// Forward and backward must agree on the side, hence one decision here.
constexpr int64_t kTransformedBytes = 64 << 20;

[[maybe_unused]] bool use_value_side(const AggregateSizes& s, int64_t elem_bytes) {
  return s.m < s.n && s.g * s.m * s.k * s.c_out * elem_bytes <= kTransformedBytes;
}

// ---- Kernel layouts -----------------------------------------------------------------------------

// Each layout is a permuted opmath copy of the (small) kernel, chosen so that the loops and GEMMs
// read it with unit stride.
enum class Layout {
  kTapsByChannel,  // depthwise [K, C]: tap k is a contiguous channel vector
  kFlatByOut,      // standard [K*C, C']: rows (k,c), the forward GEMM's right operand
  kOutByFlat,      // standard [C', K*C]: dy [.,C'] @ this = the gradient w.r.t. neighbourhoods
  kFlatOutByIn,    // standard [K*C', C]: Z [.,K*C'] @ this = the gradient w.r.t. values
  kInByFlatOut,    // standard [C, K*C']: v [.,C] @ this = v through every tap
};

template <typename T, typename scalar_t>
void lay_out_kernel(const scalar_t* kernel, const AggregateSizes& s, Layout layout, T* out) {
  const int64_t c_in = s.c, c_out = s.c_out, k_taps = s.k;
  if (layout == Layout::kTapsByChannel) {
    for (int64_t c = 0; c < c_in; ++c) {
      for (int64_t k = 0; k < k_taps; ++k) {
        out[k * c_in + c] = static_cast<T>(kernel[c * k_taps + k]);
      }
    }
    return;
  }
  for (int64_t o = 0; o < c_out; ++o) {
    for (int64_t c = 0; c < c_in; ++c) {
      for (int64_t k = 0; k < k_taps; ++k) {
        const T value = static_cast<T>(kernel[(o * c_in + c) * k_taps + k]);
        switch (layout) {
          case Layout::kFlatByOut:
            out[(k * c_in + c) * c_out + o] = value;
            break;
          case Layout::kOutByFlat:
            out[o * k_taps * c_in + k * c_in + c] = value;
            break;
          case Layout::kFlatOutByIn:
            out[(k * c_out + o) * c_in + c] = value;
            break;
          case Layout::kInByFlatOut:
            out[c * k_taps * c_out + k * c_out + o] = value;
            break;
          case Layout::kTapsByChannel:
            break;
        }
      }
    }
  }
}

// The kernel in `layout`: the caller's prepared copy when it made one, else laid out into
// `storage` (which must then hold the kernel's size).
template <typename T, typename scalar_t>
const T* laid_out(const scalar_t* kernel, const AggregateSizes& s, Layout layout, const T* prepared,
                  T* storage) {
  if (prepared != nullptr) return prepared;
  lay_out_kernel(kernel, s, layout, storage);
  return storage;
}

}  // namespace
}  // namespace convnn::cpu::CONVNN_CPU_ISA
