#pragma once
// Pieces shared by the generic ops (src/ops/generic/generic.h). Every function uses only ATen ops
// that have kernels on every device, Meta included (no at::where, abs, logical_not, cdist,
// index_select, searchsorted, segment_reduce or conv1d: their Meta kernels exist only in Python),
// and takes the device of every tensor it creates from its inputs. The one exception,
// segment_reduce in sum_into_rows, is used only where it has a kernel (CPU, CUDA), beside a
// fallback that runs everywhere.
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <initializer_list>

#include <cstdint>
#include <functional>
#include <tuple>

#include "convnn/ops/rho.h"
#include "convnn/ops/similarity.h"
#include "ops/composite/knn_attention_backward.h"

namespace convnn::ops::generic {

// A block of the [G,N] query rows: slices [slice, slice + slices) x rows [row, row + rows).
struct RowBlock {
  int64_t slice, slices, row, rows;
};

// Calls `visit` on blocks that cover [G,N] in order (slices outer, rows inner), each as large as
// block_bytes() allows when one slice's row costs `bytes_per_slice_row`; a block has at least one
// row of one slice, whatever that costs.
void for_each_row_block(int64_t g, int64_t n, int64_t bytes_per_slice_row,
                        const std::function<void(const RowBlock&)>& visit);

// t [G,N,...] narrowed to the block's slices and rows.
at::Tensor block_of(const at::Tensor& t, const RowBlock& block);

// rows [G,M,C], indices [G,N,K] into [0,M) -> [G,N,K,C]: rows[g, indices[g,i,k], :].
at::Tensor gather_rows(const at::Tensor& rows, const at::Tensor& indices);

// The adjoint of gather_rows, deterministic: per_slot [G,N,K,C] summed into the rows of a zero
// [G,M,C] that `indices` name, each row's terms added in a fixed order (see rows.cpp): one
// segmented-reduction pass on CPU and CUDA, log2(slots) doubling passes on other devices.
at::Tensor sum_into_rows(const at::Tensor& per_slot, const at::Tensor& indices, int64_t m);

// The select inputs as every block reads them: queries and keys in the accumulation type (unit
// rows for cosine), and the mask (bool as is, additive in the accumulation type).
struct SelectOperands {
  SelectOperands(const at::Tensor& queries, const at::Tensor& keys,
                 const c10::optional<at::Tensor>& mask, Similarity similarity);
  at::Tensor queries, keys, mask;
  Similarity similarity;
  // [G,N] bool on the inputs' device: the query rows whose ranking met a NaN or +inf score, set
  // block by block and settled after the last one (settle_unrankable_rows), so that the blocks
  // never wait for the host.
  at::Tensor unrankable_rows;
};

// Bytes the select step keeps live per score entry of a block in the accumulation type `acc`.
int64_t select_bytes_per_score(at::ScalarType acc);

// The block's k best candidates: (scores [slices,rows,k] in the accumulation type, indices int64),
// lower index first among equal keys, slots by index or by descending score.
std::tuple<at::Tensor, at::Tensor> select_block(SelectOperands& in, int64_t k, bool index_order,
                                                const RowBlock& block);

// The rows whose ranking met a NaN or +inf score. Where values are read (checks::reads_values_of:
// CPU tensors; an accelerator's only with CONVNN_DEVICE_VALUE_CHECKS=1) the op raises the error of
// checks::check_rankable, naming the first bad [g, i, j]. Elsewhere a host read would stall every
// call and break CUDA graph capture, so the rows' entries of `row_outputs` ([G,N,...] floating)
// become NaN on the device instead, and the NaN reaches everything computed from them. Meta
// tensors have no values and pass.
void settle_unrankable_rows(const SelectOperands& in, const char* op,
                            std::initializer_list<at::Tensor> row_outputs);

// The aggregation of a block: values [G',M,C] of the block's slices, weights and indices
// [G',rows,K] -> [G',rows,C'].
at::Tensor aggregate_block(const at::Tensor& values, const at::Tensor& weights,
                           const at::Tensor& indices, const at::Tensor& kernel,
                           const c10::optional<at::Tensor>& bias);

// Bytes aggregate_block keeps live per query row of one slice.
int64_t aggregate_bytes_per_row(const at::Tensor& values, int64_t k, const at::Tensor& kernel);

// One gradient of a blocked backward, filled block by block: rows of a [G,N,..] gradient are
// copied, sums over rows (keys, values, kernel, bias) are added in the accumulation type, in the
// fixed order of the blocks. Contiguous whatever `like`'s strides, as the Meta kernels say
// (torch.compile checks it).
class BlockedGradient {
 public:
  void copy_rows(const at::Tensor& block_grad, const at::Tensor& like, const RowBlock& block);
  void add_slices(const at::Tensor& block_grad, const at::Tensor& like, const RowBlock& block);
  void add_whole(const at::Tensor& block_grad, const at::Tensor& like);
  at::Tensor result() const;

 private:
  at::Tensor& accumulator_for(const at::Tensor& like);
  at::Tensor total_;
  at::ScalarType dtype_ = at::kFloat;
};

// knn_attention's backward as the shared composition of `steps` (ops/composite), one block of
// query rows at a time under the block budget, its gradients summed in block order: the generic
// backward with the generic steps, CUDA's composition with the device's (src/ops/cuda).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> blocked_attention_backward(
    const composite::AttentionBackwardSteps& steps, const at::Tensor& grad_output, const at::Tensor& queries,
    const at::Tensor& keys, const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores,
    const at::Tensor& indices, const at::Tensor& weights, c10::string_view similarity, Rho rho,
    double temperature, std::array<bool, 5> output_mask);

}  // namespace convnn::ops::generic
