#pragma once
// CPU kernels are compiled twice, as ATen does: once for AVX2+FMA and once generic, each into its
// own namespace convnn::cpu::<isa> (the CONVNN_CPU_ISA macro, set by src/CMakeLists.txt), and the
// entry picks one at run time. CONVNN_CPU_ISA=generic in the environment forces the generic code.
namespace convnn::cpu {

enum class Isa { Generic, Avx2 };

// Detected once: AVX2 and FMA present and not overridden by the environment.
Isa runtime_isa();

}  // namespace convnn::cpu

// Declares a kernel function template in both ISA namespaces.
#define CONVNN_DECLARE_CPU_KERNEL(...) \
  namespace generic {                  \
  __VA_ARGS__;                         \
  }                                    \
  namespace avx2 {                     \
  __VA_ARGS__;                         \
  }
