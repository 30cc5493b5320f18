#pragma once
// The host side of the knn_select Triton kernels (select.py, pair_gradients.py): the launches that
// select.select_forward and select.select_backward make, made from C++ with the same grids and
// arguments, through a LaunchRunner as in aggregate_launches.h (tests record them on CPU tensors).
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <string>
#include <tuple>
#include <vector>

#include "convnn/ops/similarity.h"
#include "ops/cuda/triton/aggregate_launches.h"

namespace convnn::ops::cuda::triton {

/// The dtype in which the running-top-K kernels (select, fused attention forward) read the inputs
/// of an op of `dtype`: the op's where they are compiled for it (float32, and kSelectBlocks' half
/// precision ones: select.py's INPUT_DTYPES), else float32 (the launcher converts, exactly).
at::ScalarType top_k_input_dtype(at::ScalarType dtype);
/// What the running top-K takes (the select and the fused attention kernels): queries and keys in
/// top_k_input_dtype with unit-stride rows (the kernels take their RowLayouts), raw rows for every
/// similarity; the mask as given if bool, in float32 if additive, and if none the queries (a valid
/// pointer the kernel does not read), each of its slices read in place by the query slices it serves
/// (a [B,N,M] mask by its sample's heads: no copy per head); similarity_constant = sqrt(D) rounded
/// to float32 for scaled_dot, kCosineEps in float32 for cosine.
struct RankingOperands {
  at::Tensor queries, keys, mask;
  int mask_kind;
  int64_t mask_slice_stride;
  int64_t slices_per_mask_slice;  // query slices each mask slice serves (ops/mask_slices.h)
  float similarity_constant;
};
/// The kernels' runtime code of a tensor's dtype (select.py's DTYPE_CODES): float32, bfloat16, float16.
int dtype_code(at::ScalarType dtype);
RankingOperands ranking_operands(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& mask,
                                 Similarity similarity);
/// Whether the similarity is a dot product (dot, scaled_dot): its gradients are the aggregation's
/// (the select backward) and the two-kernel attention backward's.
bool is_dot_product(Similarity similarity);
/// The width of the running top-K that holds K slots: the narrowest compiled one (8 .. 64) >= K.
int64_t top_k_slots(int64_t k);
/// Every width top_k_slots gives, narrowest first: the widths the kernels are compiled at.
const std::vector<int64_t>& top_k_slot_widths();
/// Query rows per program of the running-top-K kernels (select, fused attention forward) at K.
int64_t top_k_rows(int64_t k);
/// The end of a key of a kernel compiled per input dtype (top_k_input_dtype) for an op of `dtype`:
/// " bfloat16 inputs", " float16 inputs", or nothing for the float32 kernels, as specialisations.py's
/// input_pointers names them.
std::string input_key_suffix(at::ScalarType dtype);
/// The key of a running-top-K kernel ("select" or "attention") for a similarity, K, mask kind and the
/// op's dtype, as python/convnn/_triton/specialisations.py names it.
std::string top_k_key(const char* kernel, Similarity similarity, int64_t k, int mask_kind, at::ScalarType dtype);
/// Every key of a running-top-K kernel for an op of `dtype`: each similarity, width and mask kind.
std::vector<std::string> top_k_keys(const char* kernel, at::ScalarType dtype);

/// Whether the kernels take these (checked) inputs: K within the widest running top-K, every size
/// within 32 bits, the slices within CUDA's grid (the backward also needs aggregate_fits for the
/// dot products, which go through the aggregation kernels).
bool select_fits(const at::Tensor& queries, const at::Tensor& keys, int64_t k);
/// The key of every select kernel for an op of `dtype`: the forward's and the backward's
/// pair-gradient kernels.
const std::vector<std::string>& select_kernel_keys(at::ScalarType dtype);
/// select_kernel_keys(dtype) and the aggregation's, which the dot products' backward takes.
const std::vector<std::string>& select_backward_kernel_keys(at::ScalarType dtype);

/// Which kernel scores a knn_select call's pairs: select.py's in IEEE float32, or bounded_select.py's
/// on tensor cores, with a bound on each score's error and an exact re-rank of the candidates that
/// the bounds cannot tell apart (issue 41): the same indices and scores, bit for bit.
enum class SelectScores { Ieee, TensorCores };
/// The choice for a call, by CONVNN_SELECT_SCORES (read on each call): "auto" (the default) and
/// "ieee" take the IEEE kernel, as long as no GPU has timed the tensor-core one; "tensor_cores" takes
/// the tensor-core kernel wherever it serves (kBoundedSelectBlocks' similarities, D within its
/// max_features), the IEEE one elsewhere.
SelectScores select_scores(Similarity similarity, int64_t m, int64_t d);
/// Whether select_forward scores this call ([G,N,D] or [B,H,N,D] queries and keys, checked) on tensor
/// cores: select_scores chose them, and the kernel was compiled for the call's width, mask kind and
/// dtype and can read its rows. The fused knn_attention forward, whose running top-K scores in IEEE
/// float32, declines such calls, so that knn_attention composes this select.
bool select_on_tensor_cores(const at::Tensor& queries, const at::Tensor& keys, int64_t k, Similarity similarity,
                            const at::Tensor& mask);
/// As convnn::knn_select, for inputs that the caller checked (queries [G,N,D], keys [G,M,D] of one
/// floating dtype, read in place wherever their rows are unit-stride; mask undefined, bool or
/// floating, [N,M] or [G,N,M]). The kernel ranks in
/// float32 (half precision converts exactly, in its registers or by the launcher:
/// top_k_input_dtype) and writes the scores in the op's dtype.
/// `scores_by`: select_scores' choice unless a caller (the first-call check) names one.
std::tuple<at::Tensor, at::Tensor> select_forward(const at::Tensor& queries, const at::Tensor& keys, int64_t k,
                                                  Similarity similarity, const at::Tensor& mask, bool index_order,
                                                  const LaunchRunner& run, SelectScores scores_by);
std::tuple<at::Tensor, at::Tensor> select_forward(const at::Tensor& queries, const at::Tensor& keys, int64_t k,
                                                  Similarity similarity, const at::Tensor& mask, bool index_order,
                                                  const LaunchRunner& run);

/// As convnn::knn_select_backward: dot and scaled_dot through the aggregation kernels with a
/// kernel of ones, the others through the pair-gradient kernels (the K selected pairs only).
std::tuple<at::Tensor, at::Tensor> select_backward(const at::Tensor& grad_scores, const at::Tensor& queries,
                                                   const at::Tensor& keys, const at::Tensor& indices,
                                                   const at::Tensor& scores, Similarity similarity,
                                                   const LaunchRunner& run);

}  // namespace convnn::ops::cuda::triton
