#include "convnn/train/optim.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <string>
#include <vector>

namespace convnn::train {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The decaying group first, then (when not empty) the exempt one with weight_decay 0.
template <typename Optim, typename Options>
std::unique_ptr<torch::optim::Optimizer> grouped(const std::vector<at::Tensor>& decay,
                                                 const std::vector<at::Tensor>& exempt,
                                                 Options options, double weight_decay) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<Options>(Options(options).weight_decay(weight_decay)));
  if (!exempt.empty()) groups.emplace_back(exempt, std::make_unique<Options>(Options(options).weight_decay(0.0)));
  return std::make_unique<Optim>(std::move(groups), options.weight_decay(weight_decay));
}

}  // namespace

bool is_decay_exempt(const std::string& name, const at::Tensor& parameter) {
  return parameter.dim() <= 1 || ends_with(name, "position_embedding") || ends_with(name, "class_token") ||
         ends_with(name, "cls_token") || ends_with(name, "pos_embed");
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizationConfig& c,
                                                        torch::nn::Module& module) {
  std::vector<at::Tensor> decay, exempt;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    const bool skip = c.decay_on == DecayOn::Weights && is_decay_exempt(item.key(), item.value());
    (skip ? exempt : decay).push_back(item.value());
  }
  if (c.optimizer == OptimizerKind::AdamW) {
    return grouped<torch::optim::AdamW>(
        decay, exempt, torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps), c.weight_decay);
  }
  return grouped<torch::optim::SGD>(
      decay, exempt, torch::optim::SGDOptions(c.lr).momentum(c.momentum).nesterov(c.nesterov), c.weight_decay);
}

void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace convnn::train
