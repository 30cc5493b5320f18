// convnn::knn_attention: the fused select + rho + aggregate, schema and the C++ entry point through
// the dispatcher. It equals knn_select -> rho -> knn_aggregate (tests/ops/knn_attention_test.cpp).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "convnn/ops/knn_ops.h"

TORCH_LIBRARY_FRAGMENT(convnn, m) {
  m.def("knn_attention(Tensor queries, Tensor keys, Tensor values, Tensor kernel, Tensor? bias, "
        "int k, str similarity, Tensor? mask, bool index_order, str rho, float temperature) -> "
        "(Tensor output, Tensor scores, Tensor indices, Tensor weights)");
  m.def("knn_attention_backward(Tensor grad_output, Tensor queries, Tensor keys, Tensor values, "
        "Tensor kernel, Tensor scores, Tensor indices, Tensor weights, str similarity, str rho, "
        "float temperature, bool[5] output_mask) -> (Tensor grad_queries, Tensor grad_keys, "
        "Tensor grad_values, Tensor grad_kernel, Tensor grad_bias)");
}

namespace convnn::ops {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention(
    const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
    const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k,
    const std::string& similarity, const c10::optional<at::Tensor>& mask, bool index_order,
    const std::string& rho, double temperature) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("convnn::knn_attention", "")
                       .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&, const c10::optional<at::Tensor>&, int64_t,
                           c10::string_view, const c10::optional<at::Tensor>&, bool,
                           c10::string_view, double)>();
  // The dispatcher needs a device from every tensor; say which one is missing before it asks.
  TORCH_CHECK(queries.defined(), "knn_attention: queries must be a defined tensor");
  TORCH_CHECK(keys.defined(), "knn_attention: keys must be a defined tensor");
  TORCH_CHECK(values.defined(), "knn_attention: values must be a defined tensor");
  TORCH_CHECK(kernel.defined(), "knn_attention: kernel must be a defined tensor");
  return op.call(queries, keys, values, kernel, bias, k, similarity, mask, index_order, rho,
                 temperature);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_backward(
    const at::Tensor& grad_output, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores,
    const at::Tensor& indices, const at::Tensor& weights, const std::string& similarity,
    const std::string& rho, double temperature, std::array<bool, 5> output_mask) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("convnn::knn_attention_backward", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              c10::string_view, c10::string_view, double, std::array<bool, 5>)>();
  return op.call(grad_output, queries, keys, values, kernel, scores, indices, weights, similarity,
                 rho, temperature, output_mask);
}

}  // namespace convnn::ops
