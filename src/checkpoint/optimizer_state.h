#pragma once
// The optimiser's state as plain data, laid out as torch.optim's Optimizer.state_dict():
//   {"state": {index: {"step": tensor, "exp_avg": tensor, ...}, ...},
//    "param_groups": [{"lr": ..., "betas": (..), ..., "params": [index, ...]}, ...]}
// so that Python's torch.load(path, weights_only=True) reads it and torch.optim.AdamW / SGD load
// it with load_state_dict. Checkpoints store it this way instead of libtorch's optimiser archive,
// which is a TorchScript archive: opening one from a stranger would run the code inside it.
#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <string>

namespace convnn::checkpoint::detail {

/// The state of `optimizer` (AdamW or SGD, the optimisers convnn trains with), every tensor copied
/// to the CPU. AdamW's step is a float64 scalar tensor (torch.optim keeps a float32 one; float64
/// counts steps exactly to 2^53, and torch.optim reads either).
c10::IValue optimizer_state_dict(torch::optim::Optimizer& optimizer);

/// Loading `state_dict` (as optimizer_state_dict writes it, or torch.optim's own for the same
/// parameters) into `optimizer`. Everything is checked before the optimiser changes, and each
/// failure names `path` and the entry: the groups and their sizes, each parameter's entries, their
/// shapes and dtypes (those of the parameter), step counts, and, unless `allow_non_finite`, that
/// every value is finite. The tensors are copied beside their parameters. The learning rate of each
/// group is restored (the schedule changes it); the other options come from the run's config.
/// Checks `state_dict` whole and returns the function that loads it.
std::function<void()> prepare_optimizer_state(torch::optim::Optimizer& optimizer, const c10::IValue& state_dict,
                                              const std::string& path, bool allow_non_finite);

/// A CRC-32 of a plain value: its tensors' bytes and its scalars, in order.
uint32_t crc32_of_value(const c10::IValue& value);

}  // namespace convnn::checkpoint::detail
