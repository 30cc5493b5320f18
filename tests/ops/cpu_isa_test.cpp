// The CPU kernels' instruction set (src/ops/cpu/isa.h): CONVNN_CPU_ISA=baseline (or its former
// value, generic) forces the kernels built for baseline x86-64, which scripts/test.sh's second pass
// over tests/ops relies on; without it the CPU's own capabilities choose.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string_view>

#include "ops/cpu/isa.h"

namespace {

using convnn::cpu::Isa;

TEST(CpuIsa, TheEnvironmentForcesTheBaselineKernelsElseTheCpuChooses) {
  const char* forced = std::getenv("CONVNN_CPU_ISA");
  if (forced != nullptr && (std::string_view(forced) == "baseline" || std::string_view(forced) == "generic")) {
    EXPECT_EQ(convnn::cpu::runtime_isa(), Isa::Baseline);
    return;
  }
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  EXPECT_EQ(convnn::cpu::runtime_isa(), avx2 ? Isa::Avx2 : Isa::Baseline);
}

}  // namespace
