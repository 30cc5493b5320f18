// `convnn bench --sequence`: validate names the rule of a bad size before any measurement, and a
// small run gives every workload's rows (causal, padded and packed with a backward, decode without)
// for both paths, with positive times.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "convnn/bench/sequence_bench.h"

namespace {

namespace bench = convnn::bench;

std::string error_of(const bench::SequenceBenchConfig& config) {
  try {
    bench::validate(config);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "no error";
}

bench::SequenceBenchConfig small() {
  bench::SequenceBenchConfig c;
  c.channels = 16;
  c.heads = 4;
  c.kv_heads = 2;
  c.k = 3;
  c.tokens = {12};
  c.cache_lengths = {9};
  c.iters = 1;
  c.warmup = 0;
  return c;
}

TEST(SequenceBench, ValidateNamesTheRuleOfABadSize) {
  auto c = small();
  c.kv_heads = 3;
  EXPECT_NE(error_of(c).find("kv_heads = 3 must be at least 1 and divide heads = 4"), std::string::npos);
  c = small();
  c.tokens = {2};
  EXPECT_NE(error_of(c).find("every sequence length must be at least k = 3, got 2"), std::string::npos);
  c = small();
  c.cache_lengths = {1};
  EXPECT_NE(error_of(c).find("every cache length must be at least 2, got 1"), std::string::npos);
}

TEST(SequenceBench, ASmallRunTimesEveryWorkloadOnBothPaths) {
  const auto rows = bench::run_sequence_bench(small());
  std::set<std::string> seen;
  for (const auto& row : rows) {
    seen.insert(row.workload + "/" + row.path);
    EXPECT_GT(row.forward.median_ms, 0.0) << row.workload << " " << row.path;
    EXPECT_EQ(row.has_backward, row.workload != "decode");
    if (row.has_backward) EXPECT_GT(row.forward_backward.median_ms, 0.0);
    EXPECT_EQ(row.tokens, row.workload == "decode" ? 2 : row.workload == "causal" ? 24 : 12 + 9);
  }
  EXPECT_EQ(seen, (std::set<std::string>{"causal/convnn", "causal/sdpa", "padded/convnn", "padded/sdpa",
                                         "packed/convnn", "decode/convnn", "decode/sdpa"}));
}

}  // namespace
