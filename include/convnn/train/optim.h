#pragma once
// Optimisers from the optimisation config, with weight decay on every parameter or only on weights.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>

#include "convnn/config/train_config.h"

namespace convnn::train {

/// True for the parameters weight decay skips with DecayOn::Weights: 0-D and 1-D tensors (biases,
/// normalisation scales, ConvNN depthwise kernels are 2-D and decay), position embeddings and
/// class tokens.
bool is_decay_exempt(const std::string& name, const at::Tensor& parameter);

/// AdamW or SGD over `module`'s parameters: one group that decays and, with DecayOn::Weights,
/// one that does not. The learning rate starts at config.lr; set_lr changes every group.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizationConfig& config,
                                                        torch::nn::Module& module);
void set_lr(torch::optim::Optimizer& optimizer, double lr);

}  // namespace convnn::train
