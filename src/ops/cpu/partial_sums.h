#pragma once
// How the CPU kernels add up partial sums computed in parallel (every d(kernel) and d(bias)), so
// that the total does not depend on the number of threads: the work units are cut into
// consecutive chunks by the shapes alone (chunk_units), each chunk adds its units in order into its
// own partial, and the partials are added by a fixed pairwise tree (pairwise_tree): entry c absorbs
// entry c + step, for step = 1, 2, 4, ..., and the total ends in entry 0. A tree, not a chain, so
// that its rounding grows like log2 of the entries. Data and control only (no instruction-set code):
// the per-instruction-set kernels (aggregate_reduction.h) and the attention kernel both use it.
#include <algorithm>
#include <cstdint>

namespace convnn::cpu {

// Partials: at most this many chunks, and at most this much memory for all of them.
inline constexpr int64_t kMaxPartialChunks = 256;
inline constexpr int64_t kMaxPartialBytes = int64_t{128} << 20;

// Split of `units` work units into consecutive chunks, each owning one partial of `partial_bytes`.
struct Chunking {
  int64_t units_per_chunk = 1;
  int64_t count = 0;
};

inline Chunking chunk_units(int64_t units, int64_t min_units_per_chunk, int64_t partial_bytes) {
  const auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const int64_t max_chunks =
      std::clamp<int64_t>(kMaxPartialBytes / std::max<int64_t>(1, partial_bytes), 1, kMaxPartialChunks);
  Chunking chunking;
  chunking.units_per_chunk = std::max(min_units_per_chunk, ceil_div(units, max_chunks));
  chunking.count = units == 0 ? 0 : ceil_div(units, chunking.units_per_chunk);
  return chunking;
}

// absorb(into, from) adds entry `from` into entry `into`.
template <typename Absorb>
void pairwise_tree(int64_t entries, const Absorb& absorb) {
  for (int64_t step = 1; step < entries; step *= 2) {
    for (int64_t c = 0; c + step < entries; c += 2 * step) absorb(c, c + step);
  }
}

}  // namespace convnn::cpu
