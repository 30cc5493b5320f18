// The CPU kernels' rule for partial sums (src/ops/cpu/partial_sums.h): chunks of consecutive units
// fixed by the shapes, at most 256 of them and 128 MiB for all, added by a fixed pairwise tree.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "ops/cpu/partial_sums.h"

namespace partial_sums_test {  // apart from the files of its unity batch (tests/CMakeLists.txt)

namespace {

using convnn::cpu::chunk_units;
using convnn::cpu::pairwise_tree;

TEST(PartialSums, ChunksCoverEveryUnitOnceWithinTheCountAndMemoryCaps) {
  for (const int64_t units : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{256}, int64_t{257}, int64_t{100000}}) {
    for (const int64_t bytes : {int64_t{0}, int64_t{4}, int64_t{1} << 20, int64_t{1} << 28}) {
      SCOPED_TRACE(std::to_string(units) + " units of " + std::to_string(bytes) + " bytes");
      const auto chunking = chunk_units(units, 1, bytes);
      EXPECT_LE(chunking.count, 256);
      if (bytes > 0 && chunking.count > 1) EXPECT_LE(chunking.count * bytes, int64_t{128} << 20);
      // Consecutive chunks of units_per_chunk units, the last one partial, cover [0, units).
      EXPECT_GE(chunking.count * chunking.units_per_chunk, units);
      EXPECT_LT((chunking.count - 1) * chunking.units_per_chunk, std::max<int64_t>(units, 1));
    }
  }
  EXPECT_EQ(chunk_units(10, 4, 8).units_per_chunk, 4);  // at least the minimum per chunk
}

TEST(PartialSums, PairwiseTreeAddsEveryEntryIntoTheFirstOnceInAFixedOrder) {
  for (int64_t entries = 0; entries <= 37; ++entries) {
    std::vector<int64_t> counts(entries, 1);
    std::vector<std::pair<int64_t, int64_t>> steps;
    pairwise_tree(entries, [&](int64_t into, int64_t from) {
      EXPECT_LT(into, from);
      counts[into] += counts[from];
      counts[from] = 0;
      steps.emplace_back(into, from);
    });
    if (entries > 0) EXPECT_EQ(counts[0], entries);
    std::vector<std::pair<int64_t, int64_t>> again;
    pairwise_tree(entries, [&](int64_t into, int64_t from) { again.emplace_back(into, from); });
    EXPECT_EQ(steps, again);
  }
}

}  // namespace

}  // namespace partial_sums_test
