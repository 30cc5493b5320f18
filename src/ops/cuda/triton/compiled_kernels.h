#pragma once
// The Triton kernels of python/convnn/_triton (aggregate.py, select.py, pair_gradients.py, attention.py,
// attention_backward.py), compiled ahead of time by
// scripts/triton_aot.py at build time (no GPU needed) and embedded in libconvnn_ops: the table
// that the generated source defines (a build with CONVNN_TRITON_AOT only). Plain data, no CUDA
// types, so tests read it anywhere.
#include <cstddef>
#include <cstdint>

#include "ops/cuda/triton/blocks.h"

namespace convnn::ops::cuda::triton {

enum class ImageKind { kCubin, kPtx };

struct CompiledKernel {
  const char* key;         // the specialisation, as scripts/triton_compile_check.py names it
  const char* name;        // the entry point in the image
  int arch;                // 80 (sm_80) or 90 (sm_90a)
  ImageKind kind;          // a cubin for `arch`, or PTX that the driver compiles for newer GPUs
  int num_warps;           // threads per block: num_warps * 32
  int shared_bytes;        // dynamic shared memory per block
  // Global memory per program that the kernel writes its on-device TMA descriptors to (Triton's
  // global scratch: bounded_select._tile_descriptors), on `global_scratch_align`-byte boundaries; 0: none.
  int global_scratch_bytes;
  int global_scratch_align;
  const char* parameters;  // one letter per kernel parameter: p pointer, i int32, l int64, f float
  // One letter per pointer parameter of the signature (not the scratch pointers): the element type the
  // kernel was compiled to read (pointee_letter's letters; '*' an output in the op's dtype).
  const char* pointees;
  const char* image;
  std::size_t image_bytes;  // PTX counts without its terminating zero
};

extern const CompiledKernel kCompiledKernels[];
extern const std::size_t kCompiledKernelCount;

/// The image to load for `key` on a GPU of compute capability major.minor: the cubin of the
/// same major version and the highest minor not above the GPU's; for a GPU newer than every cubin,
/// the PTX; nullptr when neither fits (an older GPU).
const CompiledKernel* find_compiled_kernel(const char* key, int major, int minor);

}  // namespace convnn::ops::cuda::triton
