#pragma once
// CPU entry of knn_select and its backward: validation, dtype dispatch and the kernel calls.
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <tuple>

#include "ops/cpu/knn_select_kernel.h"
#include "ops/cpu/tensor_views.h"
#include "ops/mask_slices.h"
#include "ops/op_signatures.h"

namespace convnn::cpu {

namespace op = ops::op;

// The tensors the select kernel reads: contiguous queries, keys whose slices are each dense (any
// slice stride: a slice of a longer buffer is read in place), and the mask as the kernel takes it
// (bool as is, additive converted to the accumulation type `acc_type`).
struct SelectInputs {
  SelectInputs(const at::Tensor& queries, const at::Tensor& keys,
               const c10::optional<at::Tensor>& mask, at::ScalarType acc_type);
  at::Tensor queries, keys, mask;
};

// Parameters of the whole select problem, writing into scores and indices [G,N,k] (contiguous).
template <typename scalar_t, typename acc_t>
KnnSelectParams<scalar_t, acc_t> select_params(const SelectInputs& in, int64_t k,
                                               Similarity similarity, bool index_order,
                                               at::Tensor& scores, at::Tensor& indices) {
  KnnSelectParams<scalar_t, acc_t> p;
  p.queries = in.queries.const_data_ptr<scalar_t>();
  p.keys = in.keys.const_data_ptr<scalar_t>();
  p.keys_slice_stride = in.keys.stride(0);
  if (in.mask.defined()) {
    p.mask_slice_stride = in.mask.dim() == 3 ? in.mask.size(1) * in.mask.size(2) : 0;
    p.slices_per_mask_slice = ops::slices_per_mask_slice(in.mask, in.queries.size(0));
    if (in.mask.scalar_type() == at::kBool) {
      p.mask_bool = in.mask.const_data_ptr<bool>();
    } else {
      p.mask_additive = in.mask.const_data_ptr<acc_t>();
    }
  }
  p.slices = in.queries.size(0);
  p.queries_n = in.queries.size(1);
  p.keys_m = in.keys.size(1);
  p.features = in.queries.size(2);
  p.k = k;
  p.similarity = similarity;
  p.index_order = index_order;
  p.scores = scores.mutable_data_ptr<scalar_t>();
  p.indices = indices.mutable_data_ptr<int64_t>();
  return p;
}

// The tensors the select backward kernel reads (contiguous queries and keys), and the gradients it
// writes.
struct SelectBackwardTensors {
  SelectBackwardTensors(const at::Tensor& queries, const at::Tensor& keys);
  at::Tensor queries, keys, grad_queries, grad_keys;
};

// Parameters of the whole select backward, but for its d(scores) (the caller's to set).
template <typename scalar_t, typename acc_t>
KnnSelectBackwardParams<scalar_t, acc_t> select_backward_params(SelectBackwardTensors& t, const at::Tensor& indices,
                                                                const at::Tensor& scores, Similarity similarity) {
  KnnSelectBackwardParams<scalar_t, acc_t> p;
  p.queries = t.queries.const_data_ptr<scalar_t>();
  p.keys = t.keys.const_data_ptr<scalar_t>();
  p.indices = slots_view<const int64_t>(indices);
  p.scores = slots_view<const scalar_t>(scores);
  p.slices = t.queries.size(0);
  p.queries_n = t.queries.size(1);
  p.keys_m = t.keys.size(1);
  p.features = t.queries.size(2);
  p.k = indices.size(2);
  p.similarity = similarity;
  p.grad_queries = t.grad_queries.mutable_data_ptr<scalar_t>();
  p.grad_keys = t.grad_keys.mutable_data_ptr<scalar_t>();
  return p;
}

// The select kernel met a NaN or +inf score: finds and names it through the reference ranking.
// `op` names the caller. Never returns.
[[noreturn]] void report_unrankable(const SelectInputs& in, Similarity similarity,
                                    const c10::optional<at::Tensor>& mask, const char* op);

// The bodies of the CPU kernels, on inputs their op's check has passed (src/ops/op_signatures.h);
// the fused attention's backward calls the select backward's directly.
op::Body<op::KnnSelect> knn_select_checked;
op::Body<op::KnnSelectBackward> knn_select_backward_checked;

// The registered knn_select kernel: the op's check, then the body.
inline constexpr auto knn_select = op::checked_kernel<op::KnnSelect, &knn_select_checked>;

}  // namespace convnn::cpu
