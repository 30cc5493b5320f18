#pragma once
#include <ATen/core/Tensor.h>

#include <tuple>

namespace convnn::reference {

// rows [G,M,C], indices [G,N,K] into [0,M) -> [G,N,K,C]: rows[g, indices[g,i,k], :].
at::Tensor gather_rows(const at::Tensor& rows, const at::Tensor& indices);

// The adjoint of gather_rows: sums grad [G,N,K,C] into a zero [G,M,C] at the gathered rows.
at::Tensor scatter_rows(const at::Tensor& grad, const at::Tensor& indices, int64_t m);

// Stable sort along the last dim (equal keys keep their order, so the lower index wins ties).
// Returns (sorted, permutation).
std::tuple<at::Tensor, at::Tensor> stable_sort(const at::Tensor& t, bool descending);

}  // namespace convnn::reference
