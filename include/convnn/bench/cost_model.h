#pragma once
// FLOP and byte rules of `convnn bench`, written down once (docs/benchmarks.md states the same
// rules; the per-operation conventions are those of docs/flops.md: a multiply-accumulate is 2
// FLOPs, each elementary operation 1, comparisons such as top-k and a softmax's max are free).
// They count the useful work of the function, not what an implementation happens to do:
// both the reference and the fused path are charged the same FLOPs and bytes, so their GFLOP/s
// ratio is the inverse of their time ratio.
#include <cstdint>
#include <string>
#include <vector>

namespace convnn::bench {

/// Sizes of one benchmark case. G = batch * heads slices of N queries over M = N candidates,
/// d = channels / heads features per head.
struct CostShape {
  int64_t batch = 1;
  int64_t tokens = 1;    // N (= M)
  int64_t channels = 1;  // C
  int64_t heads = 1;     // H
  int64_t k = 1;         // K
  bool depthwise = true;
  int64_t element_size = 4;  // bytes per element of the benchmark dtype
  bool scaled = true;        // scaled_dot: one more FLOP per score (the 1/sqrt(d))
};

/// One term of a cost model, e.g. "scores" or "projections".
struct CostTerm {
  std::string name;
  double forward_flops = 0.0;
  double backward_flops = 0.0;
};

struct PhaseCost {
  double flops = 0.0;
  double bytes = 0.0;
};

struct CostModel {
  std::vector<CostTerm> terms;
  PhaseCost forward, backward, forward_backward;  // forward_backward = forward + backward
};

/// ConvNN on folded heads ([G,N,d] queries, keys, values; kernel [d,K] or [d,d,K]): selection,
/// softmax rho, aggregation.
CostModel convnn_op_cost(const CostShape& shape);
/// ConvNNAttention on [B,N,C]: the op above plus four bias-free C x C projections.
CostModel convnn_module_cost(const CostShape& shape);
/// Dense attention on the same folded heads (scaled_dot_product_attention on [G,N,d]): every score,
/// the softmax, the weighted sum of the values.
CostModel mhsa_op_cost(const CostShape& shape);
/// Multi-head self-attention on [B,N,C] with the same projections (dense N x N attention).
CostModel mhsa_module_cost(const CostShape& shape);

/// The machine's measured ceilings.
struct MachinePeaks {
  double flops_per_s = 0.0;  // large at::mm in the benchmark dtype
  double bytes_per_s = 0.0;  // large tensor copy, read + write bytes
  int64_t gemm_size = 0;     // square GEMM side used
  int64_t copy_bytes = 0;    // bytes of the copied tensor
};

/// Roofline floor in seconds: max(flops / peak rate, bytes / bandwidth).
double roofline_floor_s(const PhaseCost& cost, const MachinePeaks& peaks);

}  // namespace convnn::bench
