#include "convnn/bench/cost_model.h"

#include <algorithm>

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

// Selection, softmax rho and aggregation on G slices with d channels per slice.
std::vector<CostTerm> convnn_terms(const CostShape& shape) {
  const auto [b, n, c, h, k, g, d] = sizes_of(shape);
  const double m = n;
  std::vector<CostTerm> terms;
  // Scores: one d-long dot product per (query, candidate), plus the 1/sqrt(d) scale; the top-k
  // comparisons are free. Backward: only the K selected scores carry a gradient, to the query and
  // to the key: 2 x 2*G*N*K*d, plus the scale of the K gradients.
  const double scale = shape.scaled ? 1.0 : 0.0;
  terms.push_back({"scores", 2.0 * g * n * m * d + scale * g * n * m, 4.0 * g * n * k * d + scale * g * n * k});
  // Softmax over K scores: subtract the max, exp, sum, divide (the max is a comparison).
  terms.push_back(term("softmax", 4.0 * g * n * k));
  // Each gathered value times its weight, then the Conv1d (kernel K, stride K).
  terms.push_back(term("weighting", g * n * k * d));
  terms.push_back(term("aggregation", shape.depthwise ? 2.0 * g * n * k * d : 2.0 * g * n * k * d * d));
  return terms;
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

CostModel mhsa_module_cost(const CostShape& shape) {
  const auto s = sizes_of(shape);
  std::vector<CostTerm> terms{
      projections(s),
      term("scores", 2.0 * s.g * s.n * s.n * s.d + (shape.scaled ? s.g * s.n * s.n : 0.0)),
      term("softmax", 4.0 * s.g * s.n * s.n),
      term("attention_values", 2.0 * s.g * s.n * s.n * s.d),
  };
  return finish(std::move(terms), s.b * s.n * s.c, 4.0 * s.c * s.c, s.b * s.n * s.c, shape.element_size);
}

double roofline_floor_s(const PhaseCost& cost, const MachinePeaks& peaks) {
  const double compute = peaks.flops_per_s > 0 ? cost.flops / peaks.flops_per_s : 0.0;
  const double memory = peaks.bytes_per_s > 0 ? cost.bytes / peaks.bytes_per_s : 0.0;
  return std::max(compute, memory);
}

}  // namespace convnn::bench
