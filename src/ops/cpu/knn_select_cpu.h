#pragma once
// CPU entry of knn_select and its backward: validation, dtype dispatch and the kernel calls.
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <tuple>

namespace convnn::cpu {

std::tuple<at::Tensor, at::Tensor> knn_select(const at::Tensor& queries, const at::Tensor& keys,
                                              int64_t k, c10::string_view similarity,
                                              const c10::optional<at::Tensor>& mask,
                                              bool index_order);

std::tuple<at::Tensor, at::Tensor> knn_select_backward(const at::Tensor& grad_scores,
                                                       const at::Tensor& queries,
                                                       const at::Tensor& keys,
                                                       const at::Tensor& indices,
                                                       const at::Tensor& scores,
                                                       c10::string_view similarity);

}  // namespace convnn::cpu
