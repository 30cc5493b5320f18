#include "convnn/bench/cost_model.h"

#include <algorithm>

#include "convnn/ops/cost.h"

namespace convnn::bench {
namespace {

// Rule for every term but the selection: backward = 2 x forward (a gradient for each of the two
// operands of a product, each as expensive as the product itself).
CostTerm term(std::string name, double forward) { return {std::move(name), forward, 2.0 * forward}; }

// Bytes rule: minimal compulsory traffic. Forward reads the inputs and the weights once and writes
// the output once; backward reads the output gradient, the inputs and the weights and writes the
// input and weight gradients. Intermediates (scores, indices, weights, saved tensors) are free.
CostModel finish(std::vector<CostTerm> terms, double input_elements, double weight_elements,
                 double output_elements, int64_t element_size) {
  CostModel model;
  model.terms = std::move(terms);
  for (const auto& t : model.terms) {
    model.forward.flops += t.forward_flops;
    model.backward.flops += t.backward_flops;
  }
  const double e = static_cast<double>(element_size);
  model.forward.bytes = e * (input_elements + weight_elements + output_elements);
  model.backward.bytes = e * (output_elements + input_elements + weight_elements  // read
                              + input_elements + weight_elements);                // write
  model.forward_backward = {model.forward.flops + model.backward.flops,
                            model.forward.bytes + model.backward.bytes};
  return model;
}

struct Sizes {
  double b, n, c, h, k, g, d;
};

Sizes sizes_of(const CostShape& s) {
  const double b = static_cast<double>(s.batch), h = static_cast<double>(s.heads);
  return {b, static_cast<double>(s.tokens), static_cast<double>(s.channels), h,
          static_cast<double>(s.k), b * h, static_cast<double>(s.channels / s.heads)};
}

// Selection, softmax rho and aggregation on G slices with d channels per slice. The forward counts
// are the operator's rules (ops::knn_call_cost, docs/flops.md) for each of the B images, in FLOPs.
std::vector<CostTerm> convnn_terms(const CostShape& shape) {
  const auto [b, n, c, h, k, g, d] = sizes_of(shape);
  const auto similarity = shape.scaled ? Similarity::ScaledDot : Similarity::Dot;
  const auto call = ops::knn_call_cost(
      {shape.tokens, shape.tokens, shape.heads, shape.channels, shape.channels, shape.channels},
      {similarity, shape.k, Rho::Softmax, 1.0, shape.depthwise, false});
  const auto flops = [b = b](const ops::OpCost& cost) { return b * static_cast<double>(cost.flops()); };
  // Backward of the scores: only the K selected scores carry a gradient, to the query and to the
  // key: 2 x 2*G*N*K*d, plus the scale of the K gradients.
  const double scale = shape.scaled ? 1.0 : 0.0;
  return {{"scores", flops(call.similarity), 4.0 * g * n * k * d + scale * g * n * k},
          term("softmax", flops(*call.rho)),
          // Each gathered value times its weight, then the Conv1d (kernel K, stride K).
          term("aggregation", flops(call.aggregation))};
}

double kernel_elements(const CostShape& shape) {
  const double d = static_cast<double>(shape.channels / shape.heads), k = static_cast<double>(shape.k);
  return shape.depthwise ? d * k : d * d * k;
}

CostTerm projections(const Sizes& s) { return term("projections", 4.0 * 2.0 * s.b * s.n * s.c * s.c); }

}  // namespace

CostModel convnn_op_cost(const CostShape& shape) {
  const auto s = sizes_of(shape);
  return finish(convnn_terms(shape), 3.0 * s.g * s.n * s.d, kernel_elements(shape), s.g * s.n * s.d,
                shape.element_size);
}

CostModel convnn_module_cost(const CostShape& shape) {
  const auto s = sizes_of(shape);
  auto terms = convnn_terms(shape);
  terms.insert(terms.begin(), projections(s));
  return finish(std::move(terms), s.b * s.n * s.c, 4.0 * s.c * s.c + kernel_elements(shape),
                s.b * s.n * s.c, shape.element_size);
}

namespace {

// Dense attention's softmax: the softmax rho's rule over G*N rows of N scores (untempered: the
// scale is the scores' term).
double softmax_flops(const CostShape& shape) {
  const int64_t rows = shape.batch * shape.heads * shape.tokens;
  return static_cast<double>(ops::rho_cost(Rho::Softmax, rows, shape.tokens, 1.0)->flops());
}

}  // namespace

// Dense attention on G slices: every score, its softmax, and the weighted sum of every value.
std::vector<CostTerm> dense_attention_terms(const CostShape& shape) {
  const auto s = sizes_of(shape);
  return {term("scores", 2.0 * s.g * s.n * s.n * s.d + (shape.scaled ? s.g * s.n * s.n : 0.0)),
          term("softmax", softmax_flops(shape)), term("attention_values", 2.0 * s.g * s.n * s.n * s.d)};
}

CostModel mhsa_op_cost(const CostShape& shape) {
  const auto s = sizes_of(shape);
  return finish(dense_attention_terms(shape), 3.0 * s.g * s.n * s.d, 0.0, s.g * s.n * s.d, shape.element_size);
}

CostModel mhsa_module_cost(const CostShape& shape) {
  const auto s = sizes_of(shape);
  auto terms = dense_attention_terms(shape);
  terms.insert(terms.begin(), projections(s));
  return finish(std::move(terms), s.b * s.n * s.c, 4.0 * s.c * s.c, s.b * s.n * s.c, shape.element_size);
}

double roofline_floor_s(const PhaseCost& cost, const MachinePeaks& peaks) {
  const double compute = peaks.flops_per_s > 0 ? cost.flops / peaks.flops_per_s : 0.0;
  const double memory = peaks.bytes_per_s > 0 ? cost.bytes / peaks.bytes_per_s : 0.0;
  return std::max(compute, memory);
}

}  // namespace convnn::bench
