#pragma once
// The Triton kernels of python/convnn/_triton (aggregate.py, select.py, pair_gradients.py, attention.py,
// attention_backward.py), compiled ahead of time by
// scripts/triton_aot.py at build time (no GPU needed) and embedded in libconvnn_ops: the table
// that the generated source defines. Plain data, no CUDA types, so tests read it anywhere.
#include <cstddef>
#include <cstdint>

namespace convnn::ops::cuda::triton {

enum class ImageKind { kCubin, kPtx };

struct CompiledKernel {
  const char* key;         // the specialisation, as scripts/triton_compile_check.py names it
  const char* name;        // the entry point in the image
  int arch;                // 80 (sm_80) or 90 (sm_90a)
  ImageKind kind;          // a cubin for `arch`, or PTX that the driver compiles for newer GPUs
  int num_warps;           // threads per block: num_warps * 32
  int shared_bytes;        // dynamic shared memory per block
  const char* parameters;  // one letter per kernel parameter: p pointer, i int32, l int64, f float
  const char* image;
  std::size_t image_bytes;  // PTX counts without its terminating zero
};

extern const CompiledKernel kCompiledKernels[];
extern const std::size_t kCompiledKernelCount;

// Block sizes of the launches, from aggregate.py (ROWS, CHANNELS, KERNEL_GRADIENT_CHUNKS).
struct AggregateBlocks {
  int64_t rows;
  int64_t channels;
  int64_t kernel_gradient_chunks;
};
extern const AggregateBlocks kAggregateBlocks;

// From select.py: query rows per program, the running top-K's narrowest and widest slot counts (a
// call with K above the widest takes the generic path), and the mask kinds' codes.
struct SelectBlocks {
  int64_t rows;
  int64_t min_slots;
  int64_t max_slots;
  int no_mask, bool_mask, additive_mask;
};
extern const SelectBlocks kSelectBlocks;

// From pair_gradients.py: rows and features per program, coefficients per pair.
struct PairGradientBlocks {
  int64_t rows;
  int64_t features;
  int64_t coefficients;
};
extern const PairGradientBlocks kPairGradientBlocks;

// From attention.py: value channels per aggregation step, and the codes of rho (RHO_CODES) and of
// the op's dtype (DTYPE_CODES) that the fused attention kernel takes.
struct AttentionCodes {
  int64_t channels;
  int uniform, mean, softmax;
  int float32, bfloat16, float16;
};
extern const AttentionCodes kAttentionCodes;

// From attention_backward.py: key/value rows and channels per program of the backward's column
// kernel (COLUMN_ROWS, COLUMN_WIDTH).
struct AttentionBackwardBlocks {
  int64_t column_rows;
  int64_t column_width;
};
extern const AttentionBackwardBlocks kAttentionBackwardBlocks;

/// The image to load for `key` on a GPU of compute capability major.minor: the cubin of the
/// same major version and the highest minor not above the GPU's; for a GPU newer than every cubin,
/// the PTX; nullptr when neither fits (an older GPU).
const CompiledKernel* find_compiled_kernel(const char* key, int major, int minor);

}  // namespace convnn::ops::cuda::triton
