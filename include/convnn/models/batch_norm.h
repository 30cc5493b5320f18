#pragma once
// The models' BatchNorm2d: LibTorch's, which can also normalise a training batch with the
// statistics of every process of a data-parallel run (synchronised batch norm, as PyTorch's
// SyncBatchNorm). Its state_dict, initialisation and eval behaviour are LibTorch's.
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <functional>

namespace convnn::models {

/// Sums a tensor over the processes of a run, in place, on every process.
using AllReduceSum = std::function<void(const at::Tensor&)>;

class BatchNorm2dImpl : public torch::nn::BatchNorm2dImpl {
 public:
  using torch::nn::BatchNorm2dImpl::BatchNorm2dImpl;
  /// In training mode, normalise with the mean and variance over the batches of every process,
  /// summed by `all_reduce` (and its gradients likewise); running statistics are updated with
  /// them, the unbiased variance from the total count. Null: per process, LibTorch's.
  void synchronise(AllReduceSum all_reduce) { all_reduce_ = std::move(all_reduce); }
  at::Tensor forward(const at::Tensor& input);
  /// A deep copy of this type (LibTorch's clone would make a plain BatchNorm2d, which the
  /// containers that hold this type, such as Sequential, cannot take back).
  std::shared_ptr<torch::nn::Module> clone(const std::optional<c10::Device>& device = std::nullopt) const override;

 private:
  AllReduceSum all_reduce_;
};
TORCH_MODULE(BatchNorm2d);

/// Synchronises every models::BatchNorm2d of `model` through `all_reduce`; returns how many.
int64_t synchronise_batch_norms(torch::nn::Module& model, const AllReduceSum& all_reduce);

}  // namespace convnn::models
