#pragma once
// The cost of one ConvNN operator call (select, rho, aggregate), by the rules of docs/flops.md: the
// one place that counts it. `convnn info` (models::add_convnn_op) reports it per layer and
// `convnn bench` (bench::convnn_op_cost) turns it into FLOPs. Each similarity's and rho's share is
// its policy's cost (src/ops/kernels/).
#include <cstdint>
#include <optional>

#include "convnn/ops/rho.h"
#include "convnn/ops/similarity.h"

namespace convnn::ops {

/// Counts in the units of docs/flops.md.
struct OpCost {
  int64_t macs = 0;         // multiply-accumulates of products of two operands
  int64_t other_flops = 0;  // every other arithmetic operation
  int64_t comparisons = 0;  // reported, never counted as FLOPs
  /// FLOPs = 2 * MACs + other FLOPs.
  int64_t flops() const { return 2 * macs + other_flops; }
};

/// One call on one image: N queries, M candidates, H heads folded into the batch; the feature and
/// channel counts are totals over the heads.
struct KnnCallShape {
  int64_t queries = 0;       // N
  int64_t candidates = 0;    // M
  int64_t heads = 1;         // H
  int64_t qk_features = 0;   // D: similarity features
  int64_t channels = 0;      // C: value channels
  int64_t out_channels = 0;  // C' (= C for depthwise)
};

struct KnnCallSettings {
  Similarity similarity = Similarity::Cosine;
  int64_t k = 1;
  Rho rho = Rho::Uniform;
  double temperature = 1.0;
  bool depthwise = false;
  bool bias = false;
};

/// The call as its four steps. rho is empty when the rho computes no weights (uniform).
struct KnnCallCost {
  OpCost similarity;
  OpCost topk;
  std::optional<OpCost> rho;
  OpCost aggregation;  // weighting (unless every weight is 1), the Conv1d of kernel K, the bias
};

/// Throws c10::Error when a size is negative or k < 1.
KnnCallCost knn_call_cost(const KnnCallShape& shape, const KnnCallSettings& settings);

/// A rho over `rows` rows of k scores each, by its policy's rule; empty when it computes no weights
/// (uniform). Dense attention's softmax is rho_cost(Rho::Softmax, rows, N, 1.0).
std::optional<OpCost> rho_cost(Rho rho, int64_t rows, int64_t k, double temperature);

/// Top-k over `candidates` for each of `rows` rows: ceil(log2 k) comparisons (at least 1) per
/// candidate, the bound of a k-element heap.
int64_t topk_comparisons(int64_t rows, int64_t candidates, int64_t k);

}  // namespace convnn::ops
