#include "convnn/models/batch_norm.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

namespace convnn::models {
namespace {

// The sum over processes as an autograd operation: every process uses the sum, so the gradient
// of the total loss with respect to each process's input is the sum of all processes' gradients,
// which its backward all-reduces in turn (every process runs the same backward, in the same order).
struct AllReduceSumBackward final : torch::autograd::Node {
  AllReduceSum all_reduce;
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    auto summed = grads[0].clone();
    all_reduce(summed);
    return {summed};
  }
};

at::Tensor all_reduce_with_gradient(const at::Tensor& input, const AllReduceSum& all_reduce) {
  auto output = input.detach().clone();
  all_reduce(output);
  if (input.requires_grad()) {
    auto node = std::make_shared<AllReduceSumBackward>();
    node->all_reduce = all_reduce;
    node->set_next_edges(torch::autograd::collect_next_edges(input));
    torch::autograd::set_history(output, node);
  }
  return output;
}

}  // namespace

at::Tensor BatchNorm2dImpl::forward(const at::Tensor& input) {
  if (!all_reduce_ || !is_training()) return torch::nn::BatchNorm2dImpl::forward(input);
  TORCH_CHECK(input.dim() == 4, "BatchNorm2d: expected a 4-D input [N, C, H, W], got ", input.sizes());
  const int64_t channels = input.size(1);
  // Per channel: the sum, the sum of squares and (one slot) the count, summed over processes in one call.
  const auto count = at::full({1}, static_cast<double>(input.numel() / channels), input.options());
  const auto local = at::cat({input.sum({0, 2, 3}), (input * input).sum({0, 2, 3}), count});
  const auto global = all_reduce_with_gradient(local, all_reduce_);
  const auto total = global[2 * channels].item<double>();
  TORCH_CHECK(total > 1, "BatchNorm2d: synchronised batch norm needs more than one value per channel, got ", total);
  const auto mean = global.narrow(0, 0, channels) / total;
  const auto variance = global.narrow(0, channels, channels) / total - mean * mean;  // biased
  const auto shape = std::vector<int64_t>{1, channels, 1, 1};
  auto output = (input - mean.view(shape)) * at::rsqrt(variance.view(shape) + options.eps());
  if (options.affine()) output = output * weight.view(shape) + bias.view(shape);
  if (options.track_running_stats()) {
    at::NoGradGuard no_grad;
    num_batches_tracked += 1;
    const double momentum = options.momentum().has_value()
                                ? *options.momentum()
                                : 1.0 / num_batches_tracked.item<double>();  // a cumulative average
    running_mean.mul_(1 - momentum).add_(mean.detach(), momentum);
    running_var.mul_(1 - momentum).add_(variance.detach() * (total / (total - 1)), momentum);
  }
  return output;
}

std::shared_ptr<torch::nn::Module> BatchNorm2dImpl::clone(const std::optional<c10::Device>& device) const {
  at::NoGradGuard no_grad;
  auto copy = std::make_shared<BatchNorm2dImpl>(options);
  copy->all_reduce_ = all_reduce_;
  copy->train(is_training());
  const auto copy_into = [&](const at::Tensor& source, at::Tensor target) {
    target.set_data(device ? source.to(*device, /*non_blocking=*/false, /*copy=*/true) : source.clone());
  };
  auto parameters = copy->named_parameters(/*recurse=*/false);
  for (const auto& item : named_parameters(/*recurse=*/false)) copy_into(item.value(), parameters[item.key()]);
  auto buffers = copy->named_buffers(/*recurse=*/false);
  for (const auto& item : named_buffers(/*recurse=*/false)) copy_into(item.value(), buffers[item.key()]);
  return copy;
}

int64_t synchronise_batch_norms(torch::nn::Module& model, const AllReduceSum& all_reduce) {
  int64_t synchronised = 0;
  for (const auto& module : model.modules()) {
    if (auto* norm = dynamic_cast<BatchNorm2dImpl*>(module.get())) {
      norm->synchronise(all_reduce);
      ++synchronised;
    }
  }
  return synchronised;
}

}  // namespace convnn::models
