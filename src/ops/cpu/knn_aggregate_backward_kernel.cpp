// Fused CPU backward of knn_aggregate; the contract is in knn_aggregate_kernel.h, the shared
// arithmetic in aggregate_math.h.
//
// Deterministic: no atomics, and no summation order depends on the thread count.
//   d(weights)[g,i,k] = <W_k v[I_k], dy[g,i]>, per query row (depthwise) or per tile (standard:
//     the dy tile times the kernel as [C', K*C], then one dot product per slot).
//   d(kernel), d(bias): sums over all rows (value rows for the value side's d(kernel)), every one
//     by the chunked reduction of aggregate_reduction.h: the rows are cut into chunks by the
//     shapes alone; each chunk adds up its rows, in blocks, into its own partial, and the partials
//     are summed by a fixed pairwise tree.
//   d(values): through an inverse index (per slice, a CSR of the slots that selected each value
//     row, built by a stable counting sort), each value row gathers its contributions in slot
//     order. Standard: the row gathers Z[k,:] = sum of w * dy over its slots with tap k, then one
//     GEMM per tile of value rows applies the kernel as [K*C', C]. On the value side Z also gives
//     d(kernel) = sum over value rows of Z^T v, and d(weights)[i,k] = <dy_i, U[I_k, k]>.
//
// This file is compiled once per instruction set (CONVNN_CPU_ISA); see src/ops/cpu/isa.h.
#include "ops/cpu/knn_aggregate_kernel.h"

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <tuple>

#include "ops/cpu/aggregate_math.h"
#include "ops/cpu/aggregate_reduction.h"
#include "ops/cpu/inverse_index.h"
#include "ops/cpu/upcoming_lines.h"

namespace convnn::cpu::CONVNN_CPU_ISA {
namespace {

// ---- Depthwise ----------------------------------------------------------------------------------

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
  const int64_t partial_size = k_taps * c_in + c_in;
  ChunkedSum<T> sum(s.g * s.n, grain, partial_size);
  sum.run([&](const auto& for_each_chunk) {
    const UpcomingLinesCursor upcoming;
    Scratch<T> dy_buffer(c_in), row_buffer(c_in), block(partial_size);
    // Adds query row r's d(kernel) [K, C] and d(bias) [C] to acc, and stores its d(weights).
    const auto add_row = [&](int64_t r, T* acc) {
      upcoming.step();
      prefetch_selected_rows(p.values, p.indices, r + kGatherAhead, s.g * s.n, s.n, k_taps, c_in);
      const int64_t g = r / s.n, i = r % s.n;
      const T* dy = opmath_row(p.grad_output.row(g, i), c_in, dy_buffer.get());
      if (p.grad_bias) axpy(c_in, T(1), dy, acc + k_taps * c_in);
      for (int64_t k = 0; k < k_taps; ++k) {
        const T w = static_cast<T>(p.weights.at(g, i, k));
        const T* v = opmath_row(p.values.row(g, p.indices.at(g, i, k)), c_in, row_buffer.get());
        const T grad_w = dot3_and_accumulate(c_in, taps + k * c_in, v, dy, w, acc + k * c_in);
        if (p.grad_weights.data) p.grad_weights.at(g, i, k) = static_cast<scalar_t>(grad_w);
      }
    };
    for_each_chunk([&](int64_t row_begin, int64_t row_end, T* partial) {
      add_rows_in_blocks(row_begin, row_end, partial_size, block.get(), partial, add_row);
    });
  });
  for (int64_t c = 0; c < c_in; ++c) {
    for (int64_t k = 0; k < k_taps && p.grad_kernel; ++k) {
      p.grad_kernel[c * k_taps + k] = static_cast<scalar_t>(sum.total(k * c_in + c));
    }
    if (p.grad_bias) p.grad_bias[c] = static_cast<scalar_t>(sum.total(k_taps * c_in + c));
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
    const UpcomingLinesCursor upcoming;
    Scratch<T> acc_buffer(c_in);
    for (int64_t r = begin; r < end; ++r) {
      upcoming.step();
      if (r + kGatherAhead < end) {
        const int64_t ahead_g = (r + kGatherAhead) / s.m, ahead_j = (r + kGatherAhead) % s.m;
        for (const int64_t* slot = inverse.begin(ahead_g, ahead_j); slot != inverse.end(ahead_g, ahead_j); ++slot) {
          prefetch_row(p.grad_output.row(ahead_g, inverse.query(*slot)), c_in * sizeof(scalar_t));
        }
      }
      const int64_t g = r / s.m, j = r % s.m;
      const int64_t* slots = inverse.begin(g, j);
      const auto contribution = [&](int64_t t, int64_t c0, int64_t width, T* scratch) {
        const int64_t i = inverse.query(slots[t]), k = inverse.tap(slots[t]);
        return std::make_tuple(static_cast<T>(p.weights.at(g, i, k)), taps + k * c_in + c0,
                               opmath_row(p.grad_output.row(g, i) + c0, width, scratch));
      };
      sum_of_products_into</*kScaled=*/true>(c_in, static_cast<const T*>(nullptr),
                                             inverse.end(g, j) - slots, contribution,
                                             acc_buffer.get(), p.grad_values.row(g, j));
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
  const int64_t grain = row_grain(k_taps * c_in);
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
  const UpcomingLinesCursor upcoming;
  const auto& s = p.sizes;
  const int64_t c_out = s.c_out, flat_out = s.k * s.c_out;
  std::fill_n(z, count * flat_out, T(0));
  for (int64_t t = 0; t < count; ++t) {
    upcoming.step();
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
  ChunkedSum<T> sum(want_pass1 ? tiles : 0, 1, partial_size);
  sum.run([&](const auto& for_each_chunk) {
    const UpcomingLinesCursor upcoming;
    Scratch<T> dy(tile_rows * c_out), dy_t(c_out * tile_rows), gathered(tile_rows * flat),
        pulled(want_weights ? tile_rows * flat : 0), tile_grad(partial_size),
        block(std::max(c_out, tile_rows) * flat);
    for_each_chunk([&](int64_t tile_begin, int64_t tile_end, T* partial) {
      for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
        const int64_t r0 = tile * tile_rows, count = std::min(tile_rows, rows - r0);
        for (int64_t t = 0; t < count; ++t) {
          upcoming.step();
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
    });
  });
  for (int64_t o = 0; o < c_out; ++o) {
    for (int64_t c = 0; c < c_in && p.grad_kernel; ++c) {
      for (int64_t k = 0; k < k_taps; ++k) {
        p.grad_kernel[(o * c_in + c) * k_taps + k] =
            static_cast<scalar_t>(sum.total(o * flat + k * c_in + c));
      }
    }
    if (p.grad_bias) p.grad_bias[o] = static_cast<scalar_t>(sum.total(c_out * flat + o));
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

// ---- Standard kernel, value side (see use_value_side) ----------------------------------------

template <typename scalar_t>
void backward_standard_by_values(const AggregateBackwardParams<scalar_t>& p,
                                 const InverseIndex* inverse) {
  using T = at::opmath_type<scalar_t>;
  const auto& s = p.sizes;
  const int64_t c_in = s.c, c_out = s.c_out, k_taps = s.k, flat_out = s.k * s.c_out;
  // Each product below is formed only for the gradients asked for: Z for d(values) and d(kernel),
  // U only for d(weights).
  const bool want_values = p.grad_values.data != nullptr;
  const bool want_weights = p.grad_weights.data != nullptr;
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
  // inverse index), then d(values) = Z @ kernel[K*C', C], U = V @ kernel[C, K*C'] for pass 2, and
  // the tile's d(kernel) [K*C', C] = Z^T @ V added to the chunk's partial.
  const int64_t value_rows = s.g * s.m, tiles = ceil_div(value_rows, tile_rows);
  const int64_t partial_size = flat_out * c_in;
  ChunkedSum<T> kernel_sum(want_z || want_weights ? tiles : 0, 1, partial_size);
  kernel_sum.run([&](const auto& for_each_chunk) {
    const UpcomingLinesCursor upcoming;
    Scratch<T> z(tile_rows * flat_out), z_t(flat_out * tile_rows), v(tile_rows * c_in),
        dv(tile_rows * c_in), tile_grad(partial_size), block(std::max(tile_rows, c_in) * flat_out),
        dy_buffer(c_out);
    for_each_chunk([&](int64_t tile_begin, int64_t tile_end, T* partial) {
      for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
        const int64_t r0 = tile * tile_rows, count = std::min(tile_rows, value_rows - r0);
        for (int64_t t = 0; t < count; ++t) {
          upcoming.step();
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
          for (int64_t e = 0; e < flat_out; ++e) {
            z_t.get()[e * count + t] = tile_z[t * flat_out + e];
          }
        }
        tile_gemm(flat_out, c_in, count, z_t.get(), count, v.get(), c_in, tile_grad.get(),
                  block.get());
        axpy(partial_size, T(1), tile_grad.get(), partial);
      }
    });
  });
  for (int64_t o = 0; o < c_out && p.grad_kernel; ++o) {
    for (int64_t c = 0; c < c_in; ++c) {
      for (int64_t k = 0; k < k_taps; ++k) {
        p.grad_kernel[(o * c_in + c) * k_taps + k] =
            static_cast<scalar_t>(kernel_sum.total((k * c_out + o) * c_in + c));
      }
    }
  }

  // Pass 2, over query rows: d(weights)[i,k] = <dy_i, U[I_k, k]>, and per chunk of rows a partial
  // d(bias), summed in blocks of kRowBlock rows.
  if (!want_weights && !p.grad_bias) return;
  ChunkedSum<T> bias_sum(s.g * s.n, row_grain(flat_out), c_out);
  bias_sum.run([&](const auto& for_each_chunk) {
    const UpcomingLinesCursor upcoming;
    Scratch<T> dy_buffer(c_out), block(c_out);
    // Adds query row r's d(bias) to acc, and stores its d(weights).
    const auto add_row = [&](int64_t r, T* acc) {
      upcoming.step();
      const int64_t g = r / s.n, i = r % s.n;
      const T* dy = opmath_row(p.grad_output.row(g, i), c_out, dy_buffer.get());
      axpy(c_out, T(1), dy, acc);
      for (int64_t k = 0; k < k_taps && want_weights; ++k) {
        const T* u = transformed.get() + (g * s.m + p.indices.at(g, i, k)) * flat_out + k * c_out;
        p.grad_weights.at(g, i, k) = static_cast<scalar_t>(dot(c_out, dy, u));
      }
    };
    for_each_chunk([&](int64_t row_begin, int64_t row_end, T* partial) {
      add_rows_in_blocks(row_begin, row_end, c_out, block.get(), partial, add_row);
    });
  });
  for (int64_t o = 0; o < c_out && p.grad_bias; ++o) {
    p.grad_bias[o] = static_cast<scalar_t>(bias_sum.total(o));
  }
}

}  // namespace

template <typename scalar_t>
void knn_aggregate_backward_kernel(const AggregateBackwardParams<scalar_t>& p) {
  using T = at::opmath_type<scalar_t>;
  const bool value_side = !p.sizes.depthwise && use_value_side(p.sizes, sizeof(T));
  // The inverse index routes dy to the value rows: d(values), and the value side's d(kernel)
  // unless it scatters instead.
  const bool wants_routes = value_side ? (p.grad_values.data || p.grad_kernel) &&
                                             !scatter_by_slices(p.sizes)
                                       : p.grad_values.data != nullptr;
  std::shared_ptr<const InverseIndex> inverse;
  if (wants_routes) inverse = inverse_index_for(p.indices, p.sizes.g, p.sizes.n, p.sizes.k, p.sizes.m);
  const InverseIndex* routes = inverse.get();
  if (p.sizes.depthwise) {
    backward_depthwise(p, routes);
  } else if (value_side) {
    backward_standard_by_values(p, routes);
  } else {
    backward_standard_by_queries(p, routes);
  }
}

#define CONVNN_INSTANTIATE_AGGREGATE_BACKWARD(scalar_t) \
  template void knn_aggregate_backward_kernel<scalar_t>(const AggregateBackwardParams<scalar_t>&);

CONVNN_INSTANTIATE_AGGREGATE_BACKWARD(double)
CONVNN_INSTANTIATE_AGGREGATE_BACKWARD(float)
CONVNN_INSTANTIATE_AGGREGATE_BACKWARD(c10::BFloat16)
CONVNN_INSTANTIATE_AGGREGATE_BACKWARD(c10::Half)
#undef CONVNN_INSTANTIATE_AGGREGATE_BACKWARD

}  // namespace convnn::cpu::CONVNN_CPU_ISA
