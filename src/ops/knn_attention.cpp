// convnn::knn_attention: the fused select + rho + aggregate, schema and the C++ entry point through
// the dispatcher. It equals knn_select -> rho -> knn_aggregate (tests/ops/knn_attention_test.cpp).
#include "convnn/ops/knn_ops.h"
#include "ops/op_signatures.h"

TORCH_LIBRARY_FRAGMENT(convnn, m) {
  convnn::ops::op::define<convnn::ops::op::KnnAttention>(m);
  convnn::ops::op::define<convnn::ops::op::KnnAttentionBackward>(m);
  // For the Python package's tests and callers: the C++ rule below, not a copy of it.
  m.def("knn_attention_reads_head_dims_in_place(Tensor queries) -> bool",
        &convnn::ops::knn_attention_reads_head_dims_in_place);
}

namespace convnn::ops {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention(
    const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
    const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k,
    const std::string& similarity, const c10::optional<at::Tensor>& mask, bool index_order,
    const std::string& rho, double temperature) {
  const auto& dispatched = op::handle<op::KnnAttention>();
  // The dispatcher needs a device from every tensor; say which one is missing before it asks.
  TORCH_CHECK(queries.defined(), "knn_attention: queries must be a defined tensor");
  TORCH_CHECK(keys.defined(), "knn_attention: keys must be a defined tensor");
  TORCH_CHECK(values.defined(), "knn_attention: values must be a defined tensor");
  TORCH_CHECK(kernel.defined(), "knn_attention: kernel must be a defined tensor");
  return dispatched.call(queries, keys, values, kernel, bias, k, similarity, mask, index_order, rho,
                 temperature);
}

bool knn_attention_reads_head_dims_in_place(const at::Tensor& queries) {
  TORCH_CHECK(queries.defined(), "knn_attention_reads_head_dims_in_place: queries must be a defined tensor");
  const auto key = c10::computeDispatchKey(queries.scalar_type(), queries.layout(), queries.device());
  return op::handle<op::KnnAttentionDeviceFused>().hasKernelForDispatchKey(key);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_backward(
    const at::Tensor& grad_output, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores,
    const at::Tensor& indices, const at::Tensor& weights, const std::string& similarity,
    const std::string& rho, double temperature, std::array<bool, 5> output_mask) {
  const auto& dispatched = op::handle<op::KnnAttentionBackward>();
  return dispatched.call(grad_output, queries, keys, values, kernel, scores, indices, weights, similarity,
                 rho, temperature, output_mask);
}

}  // namespace convnn::ops
