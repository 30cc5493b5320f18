#include "ops/cpu/isa.h"

#include <cstdlib>
#include <string_view>

namespace convnn::cpu {

Isa runtime_isa() {
  static const Isa isa = [] {
    const char* forced = std::getenv("CONVNN_CPU_ISA");
    if (forced && std::string_view(forced) == "generic") return Isa::Generic;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? Isa::Avx2 : Isa::Generic;
  }();
  return isa;
}

}  // namespace convnn::cpu
