#pragma once
// The block sizes, limits and codes of the Triton kernels that the C++ launchers need, read from
// the kernels' modules (python/convnn/_triton) by scripts/triton_aot.py --constants at build time,
// so that each is written once: the generated source defines them in every build with the Triton
// route, embedded images or not.
#include <cstdint>

namespace convnn::ops::cuda::triton {

// Block sizes of the launches, from aggregate.py (ROWS, CHANNELS, KERNEL_GRADIENT_CHUNKS).
struct AggregateBlocks {
  int64_t rows;
  int64_t channels;
  int64_t kernel_gradient_chunks;
};
extern const AggregateBlocks kAggregateBlocks;

// From select.py: query rows per program (ROWS; THREAD_ROWS for the running top-K held a row per
// thread, at widths up to THREAD_SLOTS: top_k_rows), the running top-K's narrowest and widest slot
// counts (a call with K above the widest takes the generic path), the mask kinds' codes, and which
// half-precision dtypes the running-top-K kernels are compiled to read (INPUT_DTYPES; float32
// always; the launchers convert the others to float32).
struct SelectBlocks {
  int64_t rows;
  int64_t thread_rows;
  int64_t thread_slots;
  int64_t min_slots;
  int64_t max_slots;
  int no_mask, bool_mask, additive_mask;
  bool reads_bfloat16, reads_float16;
};
extern const SelectBlocks kSelectBlocks;

// From bounded_select.py (knn_select on tensor cores, issue 41): query rows per program (ROWS), the
// widest features its error bound holds for (MAX_FEATURES), features per vector chunk (FEATURES: rows
// of whole chunks only), the widest top-K it holds (MAX_SLOTS), candidates queued per row (QUEUE),
// key rows per program of the norms kernel (KEY_NORM_ROWS), the persistent grid's most programs
// (PROGRAMS), the widest top-K of float32 inputs with an additive mask (FLOAT32_MASK_SLOTS), the
// similarities it serves (SIMILARITIES: bit s for code s), candidates per tile (CANDIDATES: also the
// entries of a bool mask per word of its bits), mask rows per program of the bits kernel
// (MASK_BITS_ROWS), the sections of the keys' norms buffer (NORM_SECTIONS), the (similarity, mask
// kind) pairs whose rows _seed_thresholds_kernel seeds (_tile_bound's: bit 3 * similarity + mask kind)
// and the most key rows a step loads at 32-bit offsets from its first (TILE_OFFSET_ROWS).
struct BoundedSelectBlocks {
  int64_t rows;
  int64_t max_features;
  int64_t features;
  int64_t max_slots;
  int64_t queue;
  int64_t key_norm_rows;
  int64_t programs;
  int64_t float32_mask_slots;
  uint32_t similarities;
  int64_t candidates;
  int64_t mask_bits_rows;
  int64_t norm_sections;
  uint32_t seeded;
  int64_t tile_offset_rows;
};
extern const BoundedSelectBlocks kBoundedSelectBlocks;

// From pair_gradients.py: rows and features per program, coefficients per pair.
struct PairGradientBlocks {
  int64_t rows;
  int64_t features;
  int64_t coefficients;
};
extern const PairGradientBlocks kPairGradientBlocks;

// From attention.py: value channels per aggregation step, the codes of rho (RHO_CODES) and of
// the op's dtype (DTYPE_CODES) that the fused attention kernel takes, and query rows per program of
// the composed forward's rho and aggregation (RHO_AGGREGATE_ROWS).
struct AttentionCodes {
  int64_t channels;
  int uniform, mean, softmax;
  int float32, bfloat16, float16;
  int64_t rho_aggregate_rows;
};
extern const AttentionCodes kAttentionCodes;

// From attention_backward.py: query rows per program of the backward's row kernel (ROW_ROWS), and
// key/value rows and channels per program of its column kernel (COLUMN_ROWS, COLUMN_WIDTH).
struct AttentionBackwardBlocks {
  int64_t row_rows;
  int64_t column_rows;
  int64_t column_width;
};
extern const AttentionBackwardBlocks kAttentionBackwardBlocks;

}  // namespace convnn::ops::cuda::triton
