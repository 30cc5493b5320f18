#pragma once
// CPU entry of the fused knn_select: validation, dtype dispatch and the kernel call.
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <tuple>

namespace convnn::cpu {

std::tuple<at::Tensor, at::Tensor> knn_select(const at::Tensor& queries, const at::Tensor& keys,
                                              int64_t k, c10::string_view similarity,
                                              const c10::optional<at::Tensor>& mask,
                                              bool index_order);

}  // namespace convnn::cpu
