#include "ops/cpu/isa.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <string_view>

namespace convnn::cpu {

Isa runtime_isa() {
  static const Isa isa = [] {
    const char* forced = std::getenv("CONVNN_CPU_ISA");
    // "generic" is the switch's former value, still honoured for scripts that set it.
    if (forced != nullptr && (std::string_view(forced) == "baseline" || std::string_view(forced) == "generic")) {
      return Isa::Baseline;
    }
    if (forced != nullptr && !std::string_view(forced).empty()) {
      TORCH_WARN("CONVNN_CPU_ISA must be 'baseline' (force the kernels built for baseline x86-64), got '",
                 forced, "'; choosing by the CPU");
    }
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? Isa::Avx2 : Isa::Baseline;
  }();
  return isa;
}

}  // namespace convnn::cpu
