// Fused CPU kernels of knn_aggregate; the contract is in knn_aggregate_kernel.h.
//
// Forward
//   depthwise: one task per (slice, query) row: y = bias + sum_k w_k * W[:,k] * v[I_k], with the
//     output channels in register-blocked vectors while the K gathered rows stream by. Nothing is
//     materialised.
//   standard, query side (M >= N): per tile of R query rows, the weighted neighbourhoods are
//     gathered into a thread-local [R, K*C] tile and multiplied by the kernel laid out as
//     [K*C, C'] (one GEMM per tile), so the O(C'*C*K) work per query runs in a GEMM micro-kernel
//     instead of scalar loops, and at most R neighbourhoods per thread exist at any time.
//   standard, value side (M < N, e.g. random candidates): every candidate row is passed through
//     every tap once by GEMMs, U = V @ kernel [C, K*C'], and each query gathers
//     sum_k w_k U[I_k, k]: M*K*C*C' instead of N*K*C*C' multiply-adds (see below).
// Backward (deterministic: no atomics, and no summation order depends on the thread count)
//   d(weights)[g,i,k] = <W_k v[I_k], dy[g,i]>, per query row (depthwise) or per tile (standard:
//     the dy tile times the kernel as [C', K*C], then one dot product per slot).
//   d(kernel), d(bias): the rows (value rows for the value side's d(kernel)) are cut into chunks
//     by the shapes alone; each chunk adds up its rows, in blocks, into its own partial, and the
//     partials are summed by a fixed pairwise tree.
//   d(values): through an inverse index (per slice, a CSR of the slots that selected each value
//     row, built by a stable counting sort), each value row gathers its contributions in slot
//     order. Standard: the row gathers Z[k,:] = sum of w * dy over its slots with tap k, then one
//     GEMM per tile of value rows applies the kernel as [K*C', C]. On the value side Z also gives
//     d(kernel) = sum over value rows of Z^T v, and d(weights)[i,k] = <dy_i, U[I_k, k]>.
//
// This file is compiled once per instruction set (CONVNN_CPU_ISA); see src/ops/cpu/isa.h.
// GEMMs run on fp32 (or fp64) tiles, single-threaded inside the parallel loops: float tiles use
// at::native::cpublas::brgemm (oneDNN's batch-reduce micro-kernel where the CPU has one, BLAS
// otherwise); double, the test precision, uses a plain vectorised loop.
#include "ops/cpu/knn_aggregate_kernel.h"
#include "ops/cpu/inverse_index.h"

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <new>
#include <optional>
#include <tuple>
#include <type_traits>

namespace convnn::cpu::CONVNN_CPU_ISA {
namespace {

// Minimum multiply-adds per parallel task, so that small problems do not pay for threading.
constexpr int64_t kGrainWork = 1 << 15;
// A thread's GEMM tiles ([rows, K*max(C,C')] each) should stay within L2.
constexpr int64_t kTileBytes = 512 << 10;
// Kernel-gradient partials: at most this many chunks, and at most this much memory for all of them.
constexpr int64_t kMaxChunks = 256;
constexpr int64_t kPartialBytes = 128 << 20;
// Long sums are split into blocks whose results are then added: a GEMM sums at most kGemmBlock
// products in one chain, a kernel-gradient chunk sums at most kRowBlock rows in one chain. A single
// chain over a reduction of length L loses accuracy like L (BLAS libraries block for the same
// reason); blocking keeps the error at or below that of the reference path's BLAS calls.
constexpr int64_t kGemmBlock = 64;
constexpr int64_t kRowBlock = 32;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }


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
// in the depthwise backward share its loads.
template <typename T>
T dot3_and_accumulate(int64_t n, const T* u, const T* x, const T* y, T a, T* acc) {
  const Vec<T> av(a);
  Vec<T> sum_vec(T(0));
  int64_t c = 0;
  for (; c + Vec<T>::size() <= n; c += Vec<T>::size()) {
    const Vec<T> xy = Vec<T>::loadu(x + c) * Vec<T>::loadu(y + c);
    sum_vec = at::vec::fmadd(Vec<T>::loadu(u + c), xy, sum_vec);
    at::vec::fmadd(av, xy, Vec<T>::loadu(acc + c)).store(acc + c);
  }
  T sum = reduce_lanes(sum_vec);
  for (; c < n; ++c) {
    const T xy = x[c] * y[c];
    sum += u[c] * xy;
    acc[c] += a * xy;
  }
  return sum;
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
  constexpr int64_t kBlockVectors = 4;
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
void gemm_chain(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                int64_t ldb, float* c, int64_t ldc) {
  at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, /*add_C=*/false, a, b, c, /*is_vnni=*/false);
}

void gemm_chain(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b,
                int64_t ldb, double* c, int64_t ldc) {
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
int64_t standard_tile_rows(const AggregateSizes& s, int64_t elem_bytes) {
  const int64_t row_bytes = std::max<int64_t>(1, s.k * std::max(s.c, s.c_out)) * elem_bytes;
  const int64_t rows = std::max<int64_t>(1, s.g * std::max(s.n, s.m));
  return std::min(rows, std::clamp<int64_t>(kTileBytes / row_bytes, 8, 128));
}

// Split of `units` work units (rows or tiles) into consecutive chunks, each owning one partial
// kernel gradient of `partial_bytes`.
struct Chunking {
  int64_t units_per_chunk = 1;
  int64_t count = 0;
};

Chunking kernel_grad_chunks(int64_t units, int64_t min_units_per_chunk, int64_t partial_bytes) {
  const int64_t max_chunks =
      std::clamp<int64_t>(kPartialBytes / std::max<int64_t>(1, partial_bytes), 1, kMaxChunks);
  Chunking chunking;
  chunking.units_per_chunk = std::max(min_units_per_chunk, ceil_div(units, max_chunks));
  chunking.count = units == 0 ? 0 : ceil_div(units, chunking.units_per_chunk);
  return chunking;
}

// Sums the chunk partials pairwise (chunk c absorbs chunk c + step for step = 1, 2, 4, ...), a
// fixed tree; the total ends in chunk 0. Parallel over elements, so the order stays fixed.
template <typename T>
void sum_partials(T* partials, int64_t chunks, int64_t size) {
  if (chunks <= 1) return;
  const auto tree = [&](int64_t begin, int64_t end) {
    for (int64_t step = 1; step < chunks; step *= 2) {
      for (int64_t c = 0; c + step < chunks; c += 2 * step) {
        axpy(end - begin, T(1), partials + (c + step) * size + begin, partials + c * size + begin);
      }
    }
  };
  at::parallel_for(0, size, std::max<int64_t>(1, kGrainWork / chunks), tree);
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

// ---- Forward ------------------------------------------------------------------------------------

template <typename scalar_t>
void forward_depthwise(const AggregateForwardParams<scalar_t>& p) {
  using T = at::opmath_type<scalar_t>;
  const auto& s = p.sizes;
  const int64_t c_in = s.c, k_taps = s.k;
  const T* prepared = p.prepared.taps_by_channel;
  Scratch<T> taps_storage(prepared ? 0 : k_taps * c_in), bias(c_in);
  const T* taps = laid_out(p.kernel, s, Layout::kTapsByChannel, prepared, taps_storage.get());
  for (int64_t c = 0; c < c_in; ++c) bias.get()[c] = p.bias ? static_cast<T>(p.bias[c]) : T(0);

  const int64_t grain = std::max<int64_t>(1, kGrainWork / std::max<int64_t>(1, k_taps * c_in));
  at::parallel_for(0, s.g * s.n, grain, [&](int64_t begin, int64_t end) {
    Scratch<T> acc_buffer(c_in);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t g = r / s.n, i = r % s.n;
      const auto tap = [&](int64_t k, int64_t c0, int64_t width, T* scratch) {
        return std::make_tuple(
            static_cast<T>(p.weights.at(g, i, k)), taps + k * c_in + c0,
            opmath_row(p.values.row(g, p.indices.at(g, i, k)) + c0, width, scratch));
      };
      sum_of_products_into</*kScaled=*/true>(c_in, p.bias ? bias.get() : nullptr, k_taps, tap,
                                             acc_buffer.get(), p.out.row(g, i));
    }
  });
}

// Standard kernel, query side: per tile of query rows, gather the weighted neighbourhoods and apply
// the kernel with one GEMM. N*K*C*C' multiply-adds.
template <typename scalar_t>
void forward_standard_by_queries(const AggregateForwardParams<scalar_t>& p) {
  using T = at::opmath_type<scalar_t>;
  const auto& s = p.sizes;
  const int64_t c_in = s.c, c_out = s.c_out, k_taps = s.k, flat = s.k * s.c;
  const T* prepared = p.prepared.flat_by_out;
  Scratch<T> kernel_storage(prepared ? 0 : flat * c_out), bias(c_out);
  const T* kernel = laid_out(p.kernel, s, Layout::kFlatByOut, prepared, kernel_storage.get());
  for (int64_t o = 0; o < c_out; ++o) bias.get()[o] = p.bias ? static_cast<T>(p.bias[o]) : T(0);

  const int64_t rows = s.g * s.n;
  const int64_t tile_rows = standard_tile_rows(s, sizeof(T));
  at::parallel_for(0, ceil_div(rows, tile_rows), 1, [&](int64_t begin, int64_t end) {
    Scratch<T> neighbourhoods(tile_rows * flat), y(tile_rows * c_out), block(tile_rows * c_out),
        row_buffer(c_in);
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t r0 = tile * tile_rows, count = std::min(tile_rows, rows - r0);
      for (int64_t t = 0; t < count; ++t) {
        const int64_t g = (r0 + t) / s.n, i = (r0 + t) % s.n;
        for (int64_t k = 0; k < k_taps; ++k) {
          const T w = static_cast<T>(p.weights.at(g, i, k));
          const T* v = opmath_row(p.values.row(g, p.indices.at(g, i, k)), c_in, row_buffer.get());
          scale_copy(c_in, w, v, neighbourhoods.get() + t * flat + k * c_in);
        }
      }
      tile_gemm(count, c_out, flat, neighbourhoods.get(), flat, kernel, c_out, y.get(),
                block.get());
      for (int64_t t = 0; t < count; ++t) {
        const int64_t g = (r0 + t) / s.n, i = (r0 + t) % s.n;
        T* y_row = y.get() + t * c_out;
        if (p.bias) axpy(c_out, T(1), bias.get(), y_row);
        store_row(y_row, c_out, p.out.row(g, i));
      }
    }
  });
}

// ---- Backward -----------------------------------------------------------------------------------

// Depthwise pass 1, over query rows: d(weights), and per chunk of rows a partial d(kernel) in the
// taps layout [K, C] followed by a partial d(bias) [C]. A chunk sums blocks of kRowBlock rows
// separately and adds the block sums in order. Without d(weights) the dot products are still
// formed (they share the loads of d(kernel)) but not stored.
template <typename scalar_t>
void backward_depthwise_by_queries(const AggregateBackwardParams<scalar_t>& p,
                                   const at::opmath_type<scalar_t>* taps, int64_t grain) {
  using T = at::opmath_type<scalar_t>;
  const auto& s = p.sizes;
  const int64_t c_in = s.c, k_taps = s.k;
  const int64_t rows = s.g * s.n;
  const int64_t partial_size = k_taps * c_in + c_in;
  const Chunking chunking = kernel_grad_chunks(rows, grain, partial_size * sizeof(T));
  Scratch<T> partials(chunking.count * partial_size);
  at::parallel_for(0, chunking.count, 1, [&](int64_t begin, int64_t end) {
    Scratch<T> dy_buffer(c_in), row_buffer(c_in), block(partial_size);
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      T* partial = partials.get() + chunk * partial_size;
      std::fill_n(partial, partial_size, T(0));
      const int64_t chunk_end = std::min(rows, (chunk + 1) * chunking.units_per_chunk);
      for (int64_t r0 = chunk * chunking.units_per_chunk; r0 < chunk_end; r0 += kRowBlock) {
        std::fill_n(block.get(), partial_size, T(0));
        for (int64_t r = r0; r < std::min(chunk_end, r0 + kRowBlock); ++r) {
          const int64_t g = r / s.n, i = r % s.n;
          const T* dy = opmath_row(p.grad_output.row(g, i), c_in, dy_buffer.get());
          axpy(c_in, T(1), dy, block.get() + k_taps * c_in);
          for (int64_t k = 0; k < k_taps; ++k) {
            const T w = static_cast<T>(p.weights.at(g, i, k));
            const T* v = opmath_row(p.values.row(g, p.indices.at(g, i, k)), c_in, row_buffer.get());
            const T grad_w =
                dot3_and_accumulate(c_in, taps + k * c_in, v, dy, w, block.get() + k * c_in);
            if (p.grad_weights.data) p.grad_weights.at(g, i, k) = static_cast<scalar_t>(grad_w);
          }
        }
        axpy(partial_size, T(1), block.get(), partial);
      }
    }
  });
  sum_partials(partials.get(), chunking.count, partial_size);
  for (int64_t c = 0; c < c_in; ++c) {
    const T* total = partials.get();  // chunk 0 holds the total; no chunk means no rows: zero
    for (int64_t k = 0; k < k_taps && p.grad_kernel; ++k) {
      p.grad_kernel[c * k_taps + k] =
          static_cast<scalar_t>(chunking.count ? total[k * c_in + c] : T(0));
    }
    if (p.grad_bias) {
      p.grad_bias[c] = static_cast<scalar_t>(chunking.count ? total[k_taps * c_in + c] : T(0));
    }
  }
}

// Depthwise pass 2, over value rows: d(values)[g,j] = sum over the slots (i,k) that selected j,
// in slot order, of w[g,i,k] * W[:,k] * dy[g,i].
template <typename scalar_t>
void backward_depthwise_values(const AggregateBackwardParams<scalar_t>& p,
                               const InverseIndex& inverse, const at::opmath_type<scalar_t>* taps,
                               int64_t grain) {
  using T = at::opmath_type<scalar_t>;
  const auto& s = p.sizes;
  const int64_t c_in = s.c;
  at::parallel_for(0, s.g * s.m, grain, [&](int64_t begin, int64_t end) {
    Scratch<T> acc_buffer(c_in);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t g = r / s.m, j = r % s.m;
      const int64_t* slots = inverse.begin(g, j);
      const auto contribution = [&](int64_t t, int64_t c0, int64_t width, T* scratch) {
        const int64_t i = inverse.query(slots[t]), k = inverse.tap(slots[t]);
        return std::make_tuple(static_cast<T>(p.weights.at(g, i, k)), taps + k * c_in + c0,
                               opmath_row(p.grad_output.row(g, i) + c0, width, scratch));
      };
      const int64_t count = inverse.end(g, j) - slots;
      scalar_t* grad_row = p.grad_values.row(g, j);
      if constexpr (std::is_same_v<scalar_t, T>) {
        sum_of_products</*kScaled=*/true>(c_in, static_cast<const T*>(nullptr), count, contribution,
                                          grad_row);
      } else {
        sum_of_products</*kScaled=*/true>(c_in, static_cast<const T*>(nullptr), count, contribution,
                                          acc_buffer.get());
        store_row(acc_buffer.get(), c_in, grad_row);
      }
    }
  });
}

template <typename scalar_t>
void backward_depthwise(const AggregateBackwardParams<scalar_t>& p, const InverseIndex* inverse) {
  using T = at::opmath_type<scalar_t>;
  const auto& s = p.sizes;
  const int64_t c_in = s.c, k_taps = s.k;
  Scratch<T> taps(k_taps * c_in);
  lay_out_kernel(p.kernel, s, Layout::kTapsByChannel, taps.get());
  const int64_t grain = std::max<int64_t>(1, kGrainWork / std::max<int64_t>(1, k_taps * c_in));
  if (p.grad_weights.data || p.grad_kernel || p.grad_bias) {
    backward_depthwise_by_queries(p, taps.get(), grain);
  }
  if (p.grad_values.data) backward_depthwise_values(p, *inverse, taps.get(), grain);
}

// Z[t, k*C' + o] = sum over the slots (i,k) that selected value row r0 + t (flat over slices), in
// slot order, of w[g,i,k] * dy[g,i,o], for t < count: the output gradient routed back to each
// value row, per tap. `dy_buffer` holds C' values.
template <typename scalar_t, typename T>
void gather_weighted_gradients(const AggregateBackwardParams<scalar_t>& p,
                               const InverseIndex& inverse, int64_t r0, int64_t count, T* z,
                               T* dy_buffer) {
  const auto& s = p.sizes;
  const int64_t c_out = s.c_out, flat_out = s.k * s.c_out;
  std::fill_n(z, count * flat_out, T(0));
  for (int64_t t = 0; t < count; ++t) {
    const int64_t g = (r0 + t) / s.m, j = (r0 + t) % s.m;
    for (const int64_t* slot = inverse.begin(g, j); slot != inverse.end(g, j); ++slot) {
      const int64_t i = inverse.query(*slot), k = inverse.tap(*slot);
      const T* dy_row = opmath_row(p.grad_output.row(g, i), c_out, dy_buffer);
      axpy(c_out, static_cast<T>(p.weights.at(g, i, k)), dy_row, z + t * flat_out + k * c_out);
    }
  }
}

// The same Z for every value row of every slice at once ([G*M, K*C']), by scattering each slot's
// w[g,i,k] * dy[g,i] in query order: per (row, tap) the terms arrive in increasing (i,k) order,
// as the inverse index delivers them, so Z is bitwise the gathered one. One slice per task: it
// needs no inverse index, which costs more than the scatter when rows are short (small C').
template <typename scalar_t, typename T>
void scatter_weighted_gradients(const AggregateBackwardParams<scalar_t>& p, T* z) {
  const auto& s = p.sizes;
  const int64_t c_out = s.c_out, flat_out = s.k * s.c_out;
  at::parallel_for(0, s.g, 1, [&](int64_t begin, int64_t end) {
    Scratch<T> dy_buffer(c_out);
    for (int64_t g = begin; g < end; ++g) {
      T* z_slice = z + g * s.m * flat_out;
      std::fill_n(z_slice, s.m * flat_out, T(0));
      for (int64_t i = 0; i < s.n; ++i) {
        const T* dy_row = opmath_row(p.grad_output.row(g, i), c_out, dy_buffer.get());
        for (int64_t k = 0; k < s.k; ++k) {
          axpy(c_out, static_cast<T>(p.weights.at(g, i, k)), dy_row,
               z_slice + p.indices.at(g, i, k) * flat_out + k * c_out);
        }
      }
    }
  });
}

// Whether the value side builds Z by scattering (one task per slice) rather than through the
// inverse index (any split of the rows). Both give the same bits; the scatter needs a slice per
// thread to keep the threads busy.
bool scatter_by_slices(const AggregateSizes& s) { return s.g >= at::get_num_threads(); }

template <typename scalar_t>
void backward_standard_by_queries(const AggregateBackwardParams<scalar_t>& p,
                                  const InverseIndex* inverse) {
  using T = at::opmath_type<scalar_t>;
  const auto& s = p.sizes;
  const int64_t c_in = s.c, c_out = s.c_out, k_taps = s.k;
  const int64_t flat = k_taps * c_in, flat_out = k_taps * c_out;
  Scratch<T> kernel_out_by_flat(c_out * flat), kernel_flat_out_by_in(flat_out * c_in);
  lay_out_kernel(p.kernel, s, Layout::kOutByFlat, kernel_out_by_flat.get());
  lay_out_kernel(p.kernel, s, Layout::kFlatOutByIn, kernel_flat_out_by_in.get());
  const int64_t tile_rows = standard_tile_rows(s, sizeof(T));

  // Pass 1, over tiles of query rows. Per tile: G = gathered neighbourhoods [R, K*C] and
  // D = dy [R, C']; P = D @ kernel[C', K*C] is dy pulled back to the neighbourhoods, so
  // d(weights)[r,k] = <G[r,k,:], P[r,k,:]>; then, with G scaled by the weights, the tile's
  // d(kernel) [C', K*C] = D^T @ G and its d(bias) [C'] are added to the chunk's partial.
  // P is formed only for d(weights), and the pass is skipped when none of the three is wanted.
  const bool want_weights = p.grad_weights.data != nullptr;
  const bool want_pass1 = want_weights || p.grad_kernel || p.grad_bias;
  const int64_t rows = s.g * s.n, tiles = ceil_div(rows, tile_rows);
  const int64_t partial_size = c_out * flat + c_out;
  const Chunking chunking =
      want_pass1 ? kernel_grad_chunks(tiles, 1, partial_size * sizeof(T)) : Chunking{};
  Scratch<T> partials(chunking.count * partial_size);
  at::parallel_for(0, chunking.count, 1, [&](int64_t begin, int64_t end) {
    Scratch<T> dy(tile_rows * c_out), dy_t(c_out * tile_rows), gathered(tile_rows * flat),
        pulled(want_weights ? tile_rows * flat : 0), tile_grad(partial_size),
        block(std::max(c_out, tile_rows) * flat);
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      T* partial = partials.get() + chunk * partial_size;
      std::fill_n(partial, partial_size, T(0));
      const int64_t tile_end = std::min(tiles, (chunk + 1) * chunking.units_per_chunk);
      for (int64_t tile = chunk * chunking.units_per_chunk; tile < tile_end; ++tile) {
        const int64_t r0 = tile * tile_rows, count = std::min(tile_rows, rows - r0);
        for (int64_t t = 0; t < count; ++t) {
          const int64_t g = (r0 + t) / s.n, i = (r0 + t) % s.n;
          copy_row(p.grad_output.row(g, i), c_out, dy.get() + t * c_out);
          for (int64_t k = 0; k < k_taps; ++k) {
            copy_row(p.values.row(g, p.indices.at(g, i, k)), c_in,
                     gathered.get() + t * flat + k * c_in);
          }
        }
        if (want_weights) {
          tile_gemm(count, flat, c_out, dy.get(), c_out, kernel_out_by_flat.get(), flat,
                    pulled.get(), block.get());
        }
        T* tile_bias = tile_grad.get() + c_out * flat;
        std::fill_n(tile_bias, c_out, T(0));
        for (int64_t t = 0; t < count; ++t) {
          const int64_t g = (r0 + t) / s.n, i = (r0 + t) % s.n;
          for (int64_t k = 0; k < k_taps; ++k) {
            T* neighbour = gathered.get() + t * flat + k * c_in;
            if (want_weights) {
              p.grad_weights.at(g, i, k) =
                  static_cast<scalar_t>(dot(c_in, neighbour, pulled.get() + t * flat + k * c_in));
            }
            scale_copy(c_in, static_cast<T>(p.weights.at(g, i, k)), neighbour, neighbour);
          }
          axpy(c_out, T(1), dy.get() + t * c_out, tile_bias);
          for (int64_t o = 0; o < c_out; ++o) dy_t.get()[o * count + t] = dy.get()[t * c_out + o];
        }
        tile_gemm(c_out, flat, count, dy_t.get(), count, gathered.get(), flat, tile_grad.get(),
                  block.get());
        axpy(partial_size, T(1), tile_grad.get(), partial);
      }
    }
  });
  sum_partials(partials.get(), chunking.count, partial_size);
  const T* total = partials.get();  // chunk 0 holds the total; no chunk means no rows: zero
  for (int64_t o = 0; o < c_out; ++o) {
    for (int64_t c = 0; c < c_in && p.grad_kernel; ++c) {
      for (int64_t k = 0; k < k_taps; ++k) {
        p.grad_kernel[(o * c_in + c) * k_taps + k] =
            static_cast<scalar_t>(chunking.count ? total[o * flat + k * c_in + c] : T(0));
      }
    }
    if (p.grad_bias) {
      p.grad_bias[o] = static_cast<scalar_t>(chunking.count ? total[c_out * flat + o] : T(0));
    }
  }

  // Pass 2, over tiles of value rows. Row j gathers Z[j, k, :] = sum over the slots (i,k) that
  // selected it, in slot order, of w[g,i,k] * dy[g,i]; then d(values) = Z [R, K*C'] @
  // kernel[K*C', C].
  if (!p.grad_values.data) return;
  const int64_t value_rows = s.g * s.m;
  at::parallel_for(0, ceil_div(value_rows, tile_rows), 1, [&](int64_t begin, int64_t end) {
    Scratch<T> z(tile_rows * flat_out), dv(tile_rows * c_in), block(tile_rows * c_in),
        dy_buffer(c_out);
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t r0 = tile * tile_rows, count = std::min(tile_rows, value_rows - r0);
      gather_weighted_gradients(p, *inverse, r0, count, z.get(), dy_buffer.get());
      tile_gemm(count, c_in, flat_out, z.get(), flat_out, kernel_flat_out_by_in.get(), c_in,
                dv.get(), block.get());
      for (int64_t t = 0; t < count; ++t) {
        const int64_t g = (r0 + t) / s.m, j = (r0 + t) % s.m;
        store_row(dv.get() + t * c_in, c_in, p.grad_values.row(g, j));
      }
    }
  });
}

// ---- Standard kernel, value side ---------------------------------------------------------------
//
// With fewer candidates than queries (M < N: random candidates), passing every candidate row
// through every tap once, U[g,j,k,:] = W_k v[g,j], costs M*K*C*C' instead of the query side's
// N*K*C*C', and what is left per query is a depthwise-like gather, y = bias + sum_k w_k U[I_k,k].
// The backward mirrors it: d(kernel) = sum over value rows of Z^T v and d(weights)[i,k] =
// <dy_i, U[I_k,k]>. U ([G*M, K*C'] in opmath) is the one problem-sized buffer, so the value side
// is used only while it stays below kTransformedBytes.

constexpr int64_t kTransformedBytes = 64 << 20;

bool use_value_side(const AggregateSizes& s, int64_t elem_bytes) {
  return s.m < s.n && s.g * s.m * s.k * s.c_out * elem_bytes <= kTransformedBytes;
}

// transformed[r, :] = values[r, :] @ kernel [C, K*C'] for every value row r (flat over slices).
template <typename scalar_t, typename T>
void transform_values(const AggregateSizes& s, const RowsView<const scalar_t>& values,
                      const T* kernel_in_by_flat_out, T* transformed) {
  const int64_t flat_out = s.k * s.c_out, value_rows = s.g * s.m;
  const int64_t tile_rows = standard_tile_rows(s, sizeof(T));
  at::parallel_for(0, ceil_div(value_rows, tile_rows), 1, [&](int64_t begin, int64_t end) {
    Scratch<T> v(tile_rows * s.c), block(tile_rows * flat_out);
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t r0 = tile * tile_rows, count = std::min(tile_rows, value_rows - r0);
      for (int64_t t = 0; t < count; ++t) {
        copy_row(values.row((r0 + t) / s.m, (r0 + t) % s.m), s.c, v.get() + t * s.c);
      }
      tile_gemm(count, flat_out, s.c, v.get(), s.c, kernel_in_by_flat_out, flat_out,
                transformed + r0 * flat_out, block.get());
    }
  });
}

template <typename scalar_t>
void forward_standard_by_values(const AggregateForwardParams<scalar_t>& p) {
  using T = at::opmath_type<scalar_t>;
  const auto& s = p.sizes;
  const int64_t c_out = s.c_out, k_taps = s.k, flat_out = s.k * s.c_out;
  const T* prepared = p.prepared.in_by_flat_out;
  Scratch<T> kernel_storage(prepared ? 0 : s.c * flat_out), bias(c_out), transformed(s.g * s.m * flat_out);
  const T* kernel = laid_out(p.kernel, s, Layout::kInByFlatOut, prepared, kernel_storage.get());
  for (int64_t o = 0; o < c_out; ++o) bias.get()[o] = p.bias ? static_cast<T>(p.bias[o]) : T(0);
  transform_values(s, p.values, kernel, transformed.get());

  const int64_t grain = std::max<int64_t>(1, kGrainWork / std::max<int64_t>(1, flat_out));
  at::parallel_for(0, s.g * s.n, grain, [&](int64_t begin, int64_t end) {
    Scratch<T> acc_buffer(c_out);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t g = r / s.n, i = r % s.n;
      const auto tap = [&](int64_t k, int64_t c0, int64_t, T*) {
        const T* u = transformed.get() + (g * s.m + p.indices.at(g, i, k)) * flat_out + k * c_out;
        return std::make_tuple(static_cast<T>(p.weights.at(g, i, k)),
                               static_cast<const T*>(nullptr), u + c0);
      };
      sum_of_products_into</*kScaled=*/false>(c_out, p.bias ? bias.get() : nullptr, k_taps, tap,
                                              acc_buffer.get(), p.out.row(g, i));
    }
  });
}

template <typename scalar_t>
void backward_standard_by_values(const AggregateBackwardParams<scalar_t>& p,
                                 const InverseIndex* inverse) {
  using T = at::opmath_type<scalar_t>;
  const auto& s = p.sizes;
  const int64_t c_in = s.c, c_out = s.c_out, k_taps = s.k, flat_out = s.k * s.c_out;
  // Each product below is formed only for the gradients asked for: Z for d(values) and d(kernel),
  // U only for d(weights).
  const bool want_values = p.grad_values.data != nullptr, want_weights = p.grad_weights.data != nullptr;
  const bool want_z = want_values || p.grad_kernel;
  const bool scatter = want_z && scatter_by_slices(s);
  Scratch<T> kernel_flat_out_by_in(flat_out * c_in), kernel_in_by_flat_out(c_in * flat_out),
      transformed(want_weights ? s.g * s.m * flat_out : 0),
      scattered(scatter ? s.g * s.m * flat_out : 0);
  if (scatter) scatter_weighted_gradients(p, scattered.get());
  lay_out_kernel(p.kernel, s, Layout::kFlatOutByIn, kernel_flat_out_by_in.get());
  lay_out_kernel(p.kernel, s, Layout::kInByFlatOut, kernel_in_by_flat_out.get());
  const int64_t tile_rows = standard_tile_rows(s, sizeof(T));

  // Pass 1, over tiles of value rows: Z [R, K*C'] (scattered above, or gathered through the
  // inverse index), then
  // d(values) = Z @ kernel[K*C', C], U = V @ kernel[C, K*C'] for pass 2, and the tile's d(kernel)
  // [K*C', C] = Z^T @ V added to the chunk's partial.
  const int64_t value_rows = s.g * s.m, tiles = ceil_div(value_rows, tile_rows);
  const int64_t partial_size = flat_out * c_in;
  const Chunking chunking = want_z || want_weights
                                ? kernel_grad_chunks(tiles, 1, partial_size * sizeof(T))
                                : Chunking{};
  Scratch<T> partials(chunking.count * partial_size);
  at::parallel_for(0, chunking.count, 1, [&](int64_t begin, int64_t end) {
    Scratch<T> z(tile_rows * flat_out), z_t(flat_out * tile_rows), v(tile_rows * c_in),
        dv(tile_rows * c_in), tile_grad(partial_size), block(std::max(tile_rows, c_in) * flat_out),
        dy_buffer(c_out);
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      T* partial = partials.get() + chunk * partial_size;
      std::fill_n(partial, partial_size, T(0));
      const int64_t tile_end = std::min(tiles, (chunk + 1) * chunking.units_per_chunk);
      for (int64_t tile = chunk * chunking.units_per_chunk; tile < tile_end; ++tile) {
        const int64_t r0 = tile * tile_rows, count = std::min(tile_rows, value_rows - r0);
        for (int64_t t = 0; t < count; ++t) {
          copy_row(p.values.row((r0 + t) / s.m, (r0 + t) % s.m), c_in, v.get() + t * c_in);
        }
        if (want_weights) {
          tile_gemm(count, flat_out, c_in, v.get(), c_in, kernel_in_by_flat_out.get(), flat_out,
                    transformed.get() + r0 * flat_out, block.get());
        }
        if (!want_z) continue;
        const T* tile_z = z.get();
        if (scatter) {
          tile_z = scattered.get() + r0 * flat_out;
        } else {
          gather_weighted_gradients(p, *inverse, r0, count, z.get(), dy_buffer.get());
        }
        if (want_values) {
          tile_gemm(count, c_in, flat_out, tile_z, flat_out, kernel_flat_out_by_in.get(), c_in,
                    dv.get(), block.get());
          for (int64_t t = 0; t < count; ++t) {
            store_row(dv.get() + t * c_in, c_in,
                      p.grad_values.row((r0 + t) / s.m, (r0 + t) % s.m));
          }
        }
        for (int64_t t = 0; t < count; ++t) {
          for (int64_t e = 0; e < flat_out; ++e) z_t.get()[e * count + t] = tile_z[t * flat_out + e];
        }
        tile_gemm(flat_out, c_in, count, z_t.get(), count, v.get(), c_in, tile_grad.get(),
                  block.get());
        axpy(partial_size, T(1), tile_grad.get(), partial);
      }
    }
  });
  sum_partials(partials.get(), chunking.count, partial_size);
  const T* total = partials.get();  // chunk 0 holds the total; no chunk means no rows: zero
  for (int64_t o = 0; o < c_out && p.grad_kernel; ++o) {
    for (int64_t c = 0; c < c_in; ++c) {
      for (int64_t k = 0; k < k_taps; ++k) {
        p.grad_kernel[(o * c_in + c) * k_taps + k] =
            static_cast<scalar_t>(chunking.count ? total[(k * c_out + o) * c_in + c] : T(0));
      }
    }
  }

  // Pass 2, over query rows: d(weights)[i,k] = <dy_i, U[I_k, k]>, and per chunk of rows a partial
  // d(bias), summed in blocks of kRowBlock rows.
  if (!want_weights && !p.grad_bias) return;
  const int64_t rows = s.g * s.n;
  const int64_t grain = std::max<int64_t>(1, kGrainWork / std::max<int64_t>(1, flat_out));
  const Chunking bias_chunking = kernel_grad_chunks(rows, grain, c_out * sizeof(T));
  Scratch<T> bias_partials(bias_chunking.count * c_out);
  at::parallel_for(0, bias_chunking.count, 1, [&](int64_t begin, int64_t end) {
    Scratch<T> dy_buffer(c_out), block(c_out);
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      T* partial = bias_partials.get() + chunk * c_out;
      std::fill_n(partial, c_out, T(0));
      const int64_t chunk_end = std::min(rows, (chunk + 1) * bias_chunking.units_per_chunk);
      for (int64_t r0 = chunk * bias_chunking.units_per_chunk; r0 < chunk_end; r0 += kRowBlock) {
        std::fill_n(block.get(), c_out, T(0));
        for (int64_t r = r0; r < std::min(chunk_end, r0 + kRowBlock); ++r) {
          const int64_t g = r / s.n, i = r % s.n;
          const T* dy = opmath_row(p.grad_output.row(g, i), c_out, dy_buffer.get());
          axpy(c_out, T(1), dy, block.get());
          for (int64_t k = 0; k < k_taps && want_weights; ++k) {
            const T* u =
                transformed.get() + (g * s.m + p.indices.at(g, i, k)) * flat_out + k * c_out;
            p.grad_weights.at(g, i, k) = static_cast<scalar_t>(dot(c_out, dy, u));
          }
        }
        axpy(c_out, T(1), block.get(), partial);
      }
    }
  });
  sum_partials(bias_partials.get(), bias_chunking.count, c_out);
  if (p.grad_bias) {
    for (int64_t o = 0; o < c_out; ++o) {
      p.grad_bias[o] = static_cast<scalar_t>(bias_chunking.count ? bias_partials.get()[o] : T(0));
    }
  }
}

}  // namespace

template <typename scalar_t>
PreparedForwardKernel<at::opmath_type<scalar_t>> prepare_forward_kernel(
    const AggregateForwardParams<scalar_t>& p, at::opmath_type<scalar_t>* storage) {
  const auto& s = p.sizes;
  PreparedForwardKernel<at::opmath_type<scalar_t>> prepared;
  if (s.depthwise) {
    lay_out_kernel(p.kernel, s, Layout::kTapsByChannel, storage);
    prepared.taps_by_channel = storage;
    return prepared;
  }
  const int64_t size = s.c_out * s.c * s.k;
  lay_out_kernel(p.kernel, s, Layout::kFlatByOut, storage);
  lay_out_kernel(p.kernel, s, Layout::kInByFlatOut, storage + size);
  prepared.flat_by_out = storage;
  prepared.in_by_flat_out = storage + size;
  return prepared;
}

template <typename scalar_t>
void knn_aggregate_forward_kernel(const AggregateForwardParams<scalar_t>& p) {
  using T = at::opmath_type<scalar_t>;
  if (p.sizes.depthwise) {
    forward_depthwise(p);
  } else if (use_value_side(p.sizes, sizeof(T))) {
    forward_standard_by_values(p);
  } else {
    forward_standard_by_queries(p);
  }
}

template <typename scalar_t>
void knn_aggregate_backward_kernel(const AggregateBackwardParams<scalar_t>& p) {
  using T = at::opmath_type<scalar_t>;
  const bool value_side = !p.sizes.depthwise && use_value_side(p.sizes, sizeof(T));
  // The inverse index routes dy to the value rows: d(values), and the value side's d(kernel)
  // unless it scatters instead.
  const bool wants_routes = value_side ? (p.grad_values.data || p.grad_kernel) && !scatter_by_slices(p.sizes)
                                       : p.grad_values.data != nullptr;
  std::optional<InverseIndex> inverse;
  if (wants_routes) {
    inverse.emplace(p.indices, p.sizes.g, p.sizes.n, p.sizes.k, p.sizes.m);
  }
  const InverseIndex* routes = inverse ? &*inverse : nullptr;
  if (p.sizes.depthwise) {
    backward_depthwise(p, routes);
  } else if (value_side) {
    backward_standard_by_values(p, routes);
  } else {
    backward_standard_by_queries(p, routes);
  }
}

#define CONVNN_INSTANTIATE_AGGREGATE(scalar_t)                                                   \
  template PreparedForwardKernel<at::opmath_type<scalar_t>> prepare_forward_kernel<scalar_t>(     \
      const AggregateForwardParams<scalar_t>&, at::opmath_type<scalar_t>*);                        \
  template void knn_aggregate_forward_kernel<scalar_t>(const AggregateForwardParams<scalar_t>&); \
  template void knn_aggregate_backward_kernel<scalar_t>(const AggregateBackwardParams<scalar_t>&);

CONVNN_INSTANTIATE_AGGREGATE(double)
CONVNN_INSTANTIATE_AGGREGATE(float)
CONVNN_INSTANTIATE_AGGREGATE(c10::BFloat16)
CONVNN_INSTANTIATE_AGGREGATE(c10::Half)
#undef CONVNN_INSTANTIATE_AGGREGATE

}  // namespace convnn::cpu::CONVNN_CPU_ISA
