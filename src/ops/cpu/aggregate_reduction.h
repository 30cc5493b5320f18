#pragma once
// The deterministic parallel reduction behind every d(kernel) and d(bias) of the fused
// knn_aggregate backward (knn_aggregate_backward_kernel.cpp): a sum, over many rows or tiles of
// rows, of contributions of a fixed size, computed in parallel but in an order fixed by the shapes
// alone, so that the result does not depend on the number of threads:
//   - the work units are cut into consecutive chunks by the shapes alone (chunk_units in partial_sums.h), and
//     each chunk adds its units, in order, into its own zeroed partial;
//   - rows are added in blocks of kRowBlock (add_rows_in_blocks): each block is summed on its own
//     and the block sums are added to the partial in order;
//   - the partials are summed by the fixed pairwise tree of partial_sums.h (sum_partials).
// ChunkedSum puts the three together; each gradient pass supplies only what one chunk adds.
//
// Included only by kernel files, so it lives in the per-instruction-set namespace (see
// ops/cpu/isa.h), in an anonymous namespace as the kernel files' own helpers do.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "ops/cpu/aggregate_math.h"
#include "ops/cpu/inverse_index.h"
#include "ops/cpu/partial_sums.h"

namespace convnn::cpu::CONVNN_CPU_ISA {
namespace {

// A chunk sums at most kRowBlock rows in one chain (as a GEMM sums at most kGemmBlock products,
// aggregate_math.h): a single chain over L rows loses accuracy like L.
constexpr int64_t kRowBlock = 32;

// Sums the chunk partials by the fixed pairwise tree (partial_sums.h); the total ends in chunk 0.
// Parallel over elements, so the order stays fixed.
template <typename T>
void sum_partials(T* partials, int64_t chunks, int64_t size) {
  if (chunks <= 1) return;
  const auto tree = [&](int64_t begin, int64_t end) {
    pairwise_tree(chunks, [&](int64_t into, int64_t from) {
      axpy(end - begin, T(1), partials + from * size + begin, partials + into * size + begin);
    });
  };
  at::parallel_for(0, size, std::max<int64_t>(1, kGrainWork / chunks), tree);
}

// The sum of `size` values over `units` work units (rows or tiles), chunked as above:
//
//   ChunkedSum<T> sum(units, min_units_per_chunk, size);
//   sum.run([&](const auto& for_each_chunk) {
//     Scratch<T> ...;  // the parallel task's scratch
//     for_each_chunk([&](int64_t unit_begin, int64_t unit_end, T* partial) {
//       ...  // add units [unit_begin, unit_end), in order, into the zeroed partial
//     });
//   });
//   ... sum.total(e) ...
//
// run calls the task once per parallel task, and for_each_chunk calls the adder once per chunk of
// that task's share. No units (units == 0) means no chunk: the total is zero.
template <typename T>
class ChunkedSum {
 public:
  ChunkedSum(int64_t units, int64_t min_units_per_chunk, int64_t size)
      : size_(size),
        chunking_(chunk_units(units, min_units_per_chunk, size * sizeof(T))),
        units_(units),
        partials_(chunking_.count * size) {}

  template <typename Task>
  void run(const Task& task) {
    at::parallel_for(0, chunking_.count, 1, [&](int64_t begin, int64_t end) {
      task([&](const auto& add_units) {
        for (int64_t chunk = begin; chunk < end; ++chunk) {
          T* partial = partials_.get() + chunk * size_;
          std::fill_n(partial, size_, T(0));
          const int64_t unit_begin = chunk * chunking_.units_per_chunk;
          add_units(unit_begin, std::min(units_, unit_begin + chunking_.units_per_chunk), partial);
        }
      });
    });
    sum_partials(partials_.get(), chunking_.count, size_);
  }

  // Element e of the total (after run).
  T total(int64_t e) const { return chunking_.count ? partials_.get()[e] : T(0); }

 private:
  int64_t size_;
  Chunking chunking_;
  int64_t units_;
  Scratch<T> partials_;
};

// Adds rows [begin, end) into `partial` (`size` values) in blocks of kRowBlock rows:
// add_row(r, block) adds row r into `block`, which starts each block at zero, and each block's sum
// is then added to the partial, in order.
template <typename T, typename AddRow>
void add_rows_in_blocks(int64_t begin, int64_t end, int64_t size, T* block, T* partial,
                        const AddRow& add_row) {
  for (int64_t r0 = begin; r0 < end; r0 += kRowBlock) {
    std::fill_n(block, size, T(0));
    for (int64_t r = r0; r < std::min(end, r0 + kRowBlock); ++r) add_row(r, block);
    axpy(size, T(1), block, partial);
  }
}

}  // namespace
}  // namespace convnn::cpu::CONVNN_CPU_ISA
