#pragma once
// CPU kernels are compiled twice, as ATen does: once for AVX2+FMA and once for baseline x86-64
// (what a CPU without AVX2 runs), each into its own namespace convnn::cpu::<isa> (the CONVNN_CPU_ISA
// macro, set by src/CMakeLists.txt), and the entry picks one at run time. CONVNN_CPU_ISA=baseline
// in the environment forces the baseline code; its former value, "generic", still does. (Renamed
// "baseline" because the device-generic path, src/ops/generic, is another thing.)
namespace convnn::cpu {

enum class Isa { Baseline, Avx2 };

// Detected once: AVX2 and FMA present and not overridden by the environment.
Isa runtime_isa();

}  // namespace convnn::cpu

// Declares a kernel function template in both ISA namespaces.
#define CONVNN_DECLARE_CPU_KERNEL(...) \
  namespace baseline {                 \
  __VA_ARGS__;                         \
  }                                    \
  namespace avx2 {                     \
  __VA_ARGS__;                         \
  }
