// Compiled only when convnn is built without CUDA kernels: CUDA tensors get a clear error instead
// of the dispatcher's generic "could not run ... with the CUDA backend".
#include <ATen/core/Tensor.h>
#include <torch/library.h>

namespace convnn::cuda {
namespace {

[[noreturn]] void unavailable(const char* op, const at::Tensor& first) {
  TORCH_CHECK(false, op, ": this convnn build has no CUDA kernels, but got ", first.device(),
              " tensors; move the inputs to the CPU or rebuild with -DCONVNN_WITH_CUDA=ON");
}

std::tuple<at::Tensor, at::Tensor> knn_select(const at::Tensor& queries, const at::Tensor&,
                                              int64_t, c10::string_view,
                                              const c10::optional<at::Tensor>&, bool) {
  unavailable("knn_select", queries);
}

std::tuple<at::Tensor, at::Tensor> knn_select_backward(const at::Tensor& grad,
                                                       const at::Tensor&, const at::Tensor&,
                                                       const at::Tensor&, const at::Tensor&,
                                                       c10::string_view) {
  unavailable("knn_select_backward", grad);
}

at::Tensor knn_aggregate(const at::Tensor& values, const at::Tensor&, const at::Tensor&,
                         const at::Tensor&, const c10::optional<at::Tensor>&) {
  unavailable("knn_aggregate", values);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_aggregate_backward(
    const at::Tensor& grad, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, std::array<bool, 4>) {
  unavailable("knn_aggregate_backward", grad);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention(
    const at::Tensor& queries, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const c10::optional<at::Tensor>&, int64_t, c10::string_view, const c10::optional<at::Tensor>&,
    bool, c10::string_view, double) {
  unavailable("knn_attention", queries);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_backward(
    const at::Tensor& grad, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view,
    c10::string_view, double, std::array<bool, 5>) {
  unavailable("knn_attention_backward", grad);
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, CUDA, m) {
  m.impl("knn_select", &knn_select);
  m.impl("knn_select_backward", &knn_select_backward);
  m.impl("knn_aggregate", &knn_aggregate);
  m.impl("knn_aggregate_backward", &knn_aggregate_backward);
  m.impl("knn_attention", &knn_attention);
  m.impl("knn_attention_backward", &knn_attention_backward);
}

}  // namespace convnn::cuda
