#include "ops/reference/indexing.h"

#include <ATen/ATen.h>

namespace convnn::reference {
namespace {

// Row offsets into the [G*M, C] flattening: indices[g,i,k] + g*M.
at::Tensor flat_offsets(const at::Tensor& indices, int64_t m) {
  const auto g = indices.size(0);
  return (indices + at::arange(g, indices.options()).mul_(m).view({g, 1, 1})).reshape({-1});
}

}  // namespace

at::Tensor gather_rows(const at::Tensor& rows, const at::Tensor& indices) {
  const auto g = rows.size(0), m = rows.size(1), c = rows.size(2);
  const auto n = indices.size(1), k = indices.size(2);
  return rows.reshape({g * m, c}).index_select(0, flat_offsets(indices, m)).view({g, n, k, c});
}

at::Tensor scatter_rows(const at::Tensor& grad, const at::Tensor& indices, int64_t m) {
  const auto g = grad.size(0), c = grad.size(3);
  auto out = at::zeros({g * m, c}, grad.options());
  out.index_add_(0, flat_offsets(indices, m), grad.reshape({-1, c}));
  return out.view({g, m, c});
}

std::tuple<at::Tensor, at::Tensor> stable_sort(const at::Tensor& t, bool descending) {
  // The explicit optional<bool> picks the stable overload; a plain `true` would bind to `dim`.
  return at::sort(t, c10::optional<bool>(true), /*dim=*/-1, descending);
}

}  // namespace convnn::reference
