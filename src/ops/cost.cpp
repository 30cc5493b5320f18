#include "convnn/ops/cost.h"

#include <c10/util/Exception.h>
#include <torch/library.h>

#include <string>

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

std::optional<OpCost> rho_cost(Rho rho, int64_t rows, int64_t k, double temperature) {
  return kernels::dispatch_rho(rho, [&](auto policy) -> std::optional<OpCost> {
    using Policy = decltype(policy);
    if (!Policy::kWeighsSlots) return std::nullopt;
    return from_kernel(Policy::cost(rows, k, temperature != 1.0));
  });
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
  cost.rho = rho_cost(o.rho, h * n, o.k, o.temperature);
  // Weighting (skipped when every weight is 1), then the Conv1d of kernel K and stride K.
  if (cost.rho) cost.aggregation.other_flops += n * o.k * s.channels;
  cost.aggregation.macs = o.depthwise ? n * o.k * s.channels : n * o.k * s.channels * s.out_channels / h;
  if (o.bias) cost.aggregation.other_flops += n * s.out_channels;
  return cost;
}

namespace {

// FLOPs (2 x MACs + other FLOPs) of one call of knn_select, knn_aggregate or knn_attention on G
// slices, for torch.utils.flop_counter (python/convnn/flops.py). The slices count as heads: the
// feature and channel sizes are per slice, the totals G times them.
int64_t knn_call_flops(c10::string_view op, int64_t slices, int64_t queries, int64_t candidates,
                       int64_t qk_features, int64_t channels, int64_t out_channels, bool depthwise,
                       bool bias, int64_t k, c10::string_view similarity, c10::string_view rho,
                       double temperature) {
  const auto cost = knn_call_cost(
      {queries, candidates, slices, slices * qk_features, slices * channels, slices * out_channels},
      {parse_similarity(std::string(similarity)), k, parse_rho(std::string(rho)), temperature, depthwise, bias});
  const int64_t rho_flops = cost.rho ? cost.rho->flops() : 0;
  if (op == "knn_select") return cost.similarity.flops() + cost.topk.flops();
  if (op == "knn_aggregate") return cost.aggregation.flops();
  TORCH_CHECK(op == "knn_attention", "knn_call_flops: op must be knn_select, knn_aggregate or knn_attention, got '",
              op, "'");
  return cost.similarity.flops() + cost.topk.flops() + rho_flops + cost.aggregation.flops();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(convnn, m) {
  m.def("knn_call_flops(str op, int slices, int queries, int candidates, int qk_features, int channels, "
        "int out_channels, bool depthwise, bool bias, int k, str similarity, str rho, float temperature) -> int",
        &knn_call_flops);
}

}  // namespace convnn::ops
