#include "ops/cpu/knn_select_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>

#include "ops/checks.h"
#include "ops/cpu/knn_select_kernel.h"
#include "ops/reference/reference.h"

namespace convnn::cpu {

std::tuple<at::Tensor, at::Tensor> knn_select(const at::Tensor& queries_in, const at::Tensor& keys_in,
                                              int64_t k, c10::string_view similarity_name,
                                              const c10::optional<at::Tensor>& mask_in,
                                              bool index_order) {
  const auto similarity = checks::check_select_inputs(queries_in, keys_in, k, similarity_name, mask_in);
  const auto queries = queries_in.contiguous(), keys = keys_in.contiguous();
  const int64_t g = queries.size(0), n = queries.size(1), m = keys.size(1);
  auto scores = at::empty({g, n, k}, queries.options());
  auto indices = at::empty({g, n, k}, queries.options().dtype(at::kLong));
  if (scores.numel() == 0) return {scores, indices};

  const bool has_mask = mask_in.has_value() && mask_in->defined();
  at::Tensor mask;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, queries.scalar_type(), "knn_select_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    KnnSelectParams<scalar_t, acc_t> p;
    p.queries = queries.const_data_ptr<scalar_t>();
    p.keys = keys.const_data_ptr<scalar_t>();
    if (has_mask) {
      mask = mask_in->scalar_type() == at::kBool
                 ? mask_in->contiguous()
                 : mask_in->to(c10::CppTypeToScalarType<acc_t>::value).contiguous();
      p.mask_slice_stride = mask.dim() == 3 ? n * m : 0;
      if (mask.scalar_type() == at::kBool) {
        p.mask_bool = mask.const_data_ptr<bool>();
      } else {
        p.mask_additive = mask.const_data_ptr<acc_t>();
      }
    }
    p.slices = g;
    p.queries_n = n;
    p.keys_m = m;
    p.features = queries.size(2);
    p.k = k;
    p.similarity = similarity;
    p.index_order = index_order;
    p.scores = scores.mutable_data_ptr<scalar_t>();
    p.indices = indices.mutable_data_ptr<int64_t>();
    if (!knn_select_forward(p)) {
      // Error path only: the reference finds and names the first unrankable score.
      checks::check_rankable(reference::ranking_keys(queries, keys, similarity, mask_in), "knn_select");
    }
  });
  return {scores, indices};
}

}  // namespace convnn::cpu
