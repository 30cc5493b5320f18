// Fused CPU forward of knn_aggregate; the contract is in knn_aggregate_kernel.h, the shared
// arithmetic in aggregate_math.h.
//
//   depthwise: one task per (slice, query) row: y = bias + sum_k w_k * W[:,k] * v[I_k], with the
//     output channels in register-blocked vectors while the K gathered rows stream by. Nothing is
//     materialised.
//   standard, query side (M >= N): per tile of R query rows, the weighted neighbourhoods are
//     gathered into a thread-local [R, K*C] tile and multiplied by the kernel laid out as
//     [K*C, C'] (one GEMM per tile), so the O(C'*C*K) work per query runs in a GEMM micro-kernel
//     instead of scalar loops, and at most R neighbourhoods per thread exist at any time.
//   standard, value side (M < N, e.g. random candidates): every candidate row is passed through
//     every tap once by GEMMs, U = V @ kernel [C, K*C'], and each query gathers
//     sum_k w_k U[I_k, k]: M*K*C*C' instead of N*K*C*C' multiply-adds (see use_value_side).
// Each output row is summed by one task in a fixed order, so the result does not depend on the
// thread count. prepare_forward_kernel lays the kernel out once for callers that run the forward
// many times on one kernel (the fused attention).
//
// This file is compiled once per instruction set (CONVNN_CPU_ISA); see src/ops/cpu/isa.h.
#include "ops/cpu/knn_aggregate_kernel.h"

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "ops/cpu/aggregate_math.h"
#include "ops/cpu/inverse_index.h"
#include "ops/cpu/upcoming_lines.h"

namespace convnn::cpu::CONVNN_CPU_ISA {
namespace {

// Depthwise: y[g,i] = bias + sum_k w[g,i,k] * W[:,k] * v[g, I[g,i,k]], one register-blocked sum
// of products per query row.
template <typename scalar_t>
void forward_depthwise(const AggregateForwardParams<scalar_t>& p) {
  using T = at::opmath_type<scalar_t>;
  const auto& s = p.sizes;
  const int64_t c_in = s.c, k_taps = s.k;
  const T* prepared = p.prepared.taps_by_channel;
  Scratch<T> taps_storage(prepared ? 0 : k_taps * c_in), bias(c_in);
  const T* taps = laid_out(p.kernel, s, Layout::kTapsByChannel, prepared, taps_storage.get());
  for (int64_t c = 0; c < c_in; ++c) bias.get()[c] = p.bias ? static_cast<T>(p.bias[c]) : T(0);

  at::parallel_for(0, s.g * s.n, row_grain(k_taps * c_in), [&](int64_t begin, int64_t end) {
    const UpcomingLinesCursor upcoming;
    Scratch<T> acc_buffer(c_in);
    for (int64_t r = begin; r < end; ++r) {
      upcoming.step();
      prefetch_selected_rows(p.values, p.indices, r + kGatherAhead, end, s.n, k_taps, c_in);
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
    const UpcomingLinesCursor upcoming;
    Scratch<T> neighbourhoods(tile_rows * flat), y(tile_rows * c_out), block(tile_rows * c_out),
        row_buffer(c_in);
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t r0 = tile * tile_rows, count = std::min(tile_rows, rows - r0);
      for (int64_t t = 0; t < count; ++t) {
        upcoming.step();
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

// Standard kernel, value side: U = V @ kernel once (transform_values), then per query row
// y = bias + sum_k w_k U[I_k, k], a sum of products as in the depthwise path. M*K*C*C'
// multiply-adds.
template <typename scalar_t>
void forward_standard_by_values(const AggregateForwardParams<scalar_t>& p) {
  using T = at::opmath_type<scalar_t>;
  const auto& s = p.sizes;
  const int64_t c_out = s.c_out, k_taps = s.k, flat_out = s.k * s.c_out;
  const T* prepared = p.prepared.in_by_flat_out;
  Scratch<T> kernel_storage(prepared ? 0 : s.c * flat_out), bias(c_out),
      transformed(s.g * s.m * flat_out);
  const T* kernel = laid_out(p.kernel, s, Layout::kInByFlatOut, prepared, kernel_storage.get());
  for (int64_t o = 0; o < c_out; ++o) bias.get()[o] = p.bias ? static_cast<T>(p.bias[o]) : T(0);
  transform_values(s, p.values, kernel, transformed.get());

  at::parallel_for(0, s.g * s.n, row_grain(flat_out), [&](int64_t begin, int64_t end) {
    const UpcomingLinesCursor upcoming;
    Scratch<T> acc_buffer(c_out);
    for (int64_t r = begin; r < end; ++r) {
      upcoming.step();
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

#define CONVNN_INSTANTIATE_AGGREGATE_FORWARD(scalar_t)                                           \
  template PreparedForwardKernel<at::opmath_type<scalar_t>> prepare_forward_kernel<scalar_t>(     \
      const AggregateForwardParams<scalar_t>&, at::opmath_type<scalar_t>*);                        \
  template void knn_aggregate_forward_kernel<scalar_t>(const AggregateForwardParams<scalar_t>&);

CONVNN_INSTANTIATE_AGGREGATE_FORWARD(double)
CONVNN_INSTANTIATE_AGGREGATE_FORWARD(float)
CONVNN_INSTANTIATE_AGGREGATE_FORWARD(c10::BFloat16)
CONVNN_INSTANTIATE_AGGREGATE_FORWARD(c10::Half)
#undef CONVNN_INSTANTIATE_AGGREGATE_FORWARD

}  // namespace convnn::cpu::CONVNN_CPU_ISA
