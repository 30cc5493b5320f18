#pragma once
// The fixed pairwise tree by which the CPU kernels add up partial sums computed in parallel: entry
// c absorbs entry c + step, for step = 1, 2, 4, ..., and the total ends in entry 0. The order
// depends on the number of entries alone, so the total does not depend on the number of threads;
// and a tree, not a chain, so that its rounding grows like log2 of the entries.
#include <cstdint>

namespace convnn::cpu {

// absorb(into, from) adds entry `from` into entry `into`.
template <typename Absorb>
void pairwise_tree(int64_t entries, const Absorb& absorb) {
  for (int64_t step = 1; step < entries; step *= 2) {
    for (int64_t c = 0; c + step < entries; c += 2 * step) absorb(c, c + step);
  }
}

}  // namespace convnn::cpu
