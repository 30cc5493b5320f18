#include "convnn/ops/cost.h"

#include <c10/util/Exception.h>

#include "ops/kernels/rho.h"
#include "ops/kernels/similarity.h"

namespace convnn::ops {
namespace {

OpCost from_kernel(const kernels::OpCost& c) { return {c.macs, c.other_flops, c.comparisons}; }

}  // namespace

int64_t topk_comparisons(int64_t rows, int64_t candidates, int64_t k) {
  int64_t depth = 1;
  while ((int64_t{1} << depth) < k) ++depth;
  return rows * candidates * depth;
}

KnnCallCost knn_call_cost(const KnnCallShape& s, const KnnCallSettings& o) {
  TORCH_CHECK(s.queries >= 0 && s.candidates >= 0 && s.heads >= 1 && s.qk_features >= 0 &&
                  s.channels >= 0 && s.out_channels >= 0,
              "knn_call_cost: sizes must be >= 0 and heads >= 1");
  TORCH_CHECK(o.k >= 1, "knn_call_cost: k must be >= 1, got ", o.k);
  const int64_t n = s.queries, h = s.heads;
  KnnCallCost cost;
  cost.similarity = kernels::dispatch_similarity(o.similarity, [&](auto policy) {
    return from_kernel(decltype(policy)::cost({n, s.candidates, h, s.qk_features, o.k}));
  });
  cost.topk = {0, 0, h * topk_comparisons(n, s.candidates, o.k)};
  const bool weighs = kernels::dispatch_rho(o.rho, [&](auto policy) {
    using Policy = decltype(policy);
    if (Policy::kWeighsSlots) cost.rho = from_kernel(Policy::cost(h * n, o.k, o.temperature != 1.0));
    return Policy::kWeighsSlots;
  });
  // Weighting (skipped when every weight is 1), then the Conv1d of kernel K and stride K.
  if (weighs) cost.aggregation.other_flops += n * o.k * s.channels;
  cost.aggregation.macs = o.depthwise ? n * o.k * s.channels : n * o.k * s.channels * s.out_channels / h;
  if (o.bias) cost.aggregation.other_flops += n * s.out_channels;
  return cost;
}

}  // namespace convnn::ops
