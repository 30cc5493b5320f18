#include "checkpoint/optimizer_state.h"

#include <ATen/ops/isfinite.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <zlib.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace convnn::checkpoint::detail {
namespace {

using torch::optim::AdamW;
using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;
using torch::optim::SGD;
using torch::optim::SGDOptions;
using torch::optim::SGDParamState;

// Step counts are stored as floats (as torch.optim does); beyond 2^53 they are no longer exact.
constexpr double kMaxStep = 9007199254740992.0;

c10::impl::GenericDict new_dict() { return c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()); }

at::Tensor to_cpu_copy(const at::Tensor& tensor) { return tensor.detach().to(at::kCPU, false, true); }

// The options of a group with the keys (and defaults for what convnn does not use) of torch.optim,
// whose __setstate__ would otherwise fill in others: AdamW's decoupled_weight_decay among them.
c10::impl::GenericDict group_options(const torch::optim::OptimizerOptions& options) {
  auto group = new_dict();
  if (const auto* adamw = dynamic_cast<const AdamWOptions*>(&options)) {
    group.insert("lr", adamw->lr());
    group.insert("betas", c10::ivalue::Tuple::create({std::get<0>(adamw->betas()), std::get<1>(adamw->betas())}));
    group.insert("eps", adamw->eps());
    group.insert("weight_decay", adamw->weight_decay());
    group.insert("amsgrad", adamw->amsgrad());
    group.insert("maximize", false);
    group.insert("foreach", c10::IValue());
    group.insert("capturable", false);
    group.insert("differentiable", false);
    group.insert("fused", c10::IValue());
    group.insert("decoupled_weight_decay", true);
    return group;
  }
  const auto* sgd = dynamic_cast<const SGDOptions*>(&options);
  TORCH_CHECK(sgd != nullptr, "checkpoints hold the state of AdamW and SGD only");
  group.insert("lr", sgd->lr());
  group.insert("momentum", sgd->momentum());
  group.insert("dampening", sgd->dampening());
  group.insert("weight_decay", sgd->weight_decay());
  group.insert("nesterov", sgd->nesterov());
  group.insert("maximize", false);
  group.insert("foreach", c10::IValue());
  group.insert("differentiable", false);
  group.insert("fused", c10::IValue());
  return group;
}

c10::impl::GenericDict parameter_state(const torch::optim::OptimizerParamState& state) {
  auto entries = new_dict();
  if (const auto* adamw = dynamic_cast<const AdamWParamState*>(&state)) {
    entries.insert("step", at::scalar_tensor(static_cast<double>(adamw->step()), at::kDouble));
    entries.insert("exp_avg", to_cpu_copy(adamw->exp_avg()));
    entries.insert("exp_avg_sq", to_cpu_copy(adamw->exp_avg_sq()));
    if (adamw->max_exp_avg_sq().defined()) entries.insert("max_exp_avg_sq", to_cpu_copy(adamw->max_exp_avg_sq()));
    return entries;
  }
  const auto* sgd = dynamic_cast<const SGDParamState*>(&state);
  TORCH_CHECK(sgd != nullptr, "checkpoints hold the state of AdamW and SGD only");
  entries.insert("momentum_buffer", sgd->momentum_buffer().defined() ? c10::IValue(to_cpu_copy(sgd->momentum_buffer()))
                                                                     : c10::IValue());
  return entries;
}

// ---------------------------------------------------------------------------------------------
// Reading: everything is checked first, into these; then the optimiser is changed.

class StateReader {
 public:
  StateReader(torch::optim::Optimizer& optimizer, std::string path, bool allow_non_finite)
      : optimizer_(optimizer), path_(std::move(path)), allow_non_finite_(allow_non_finite) {}

  void read(const c10::IValue& state_dict) {
    TORCH_CHECK(state_dict.isGenericDict(), "checkpoint '", path_, "' is damaged: its optimiser state is not a dict");
    const auto dict = state_dict.toGenericDict();
    read_groups(entry(dict, "param_groups", "optimizer"));
    read_states(entry(dict, "state", "optimizer"));
  }

  void apply() {
    auto& groups = optimizer_.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(lrs_[g]);
    auto& state = optimizer_.state();
    state.clear();  // as torch.optim's load_state_dict: the file's state replaces the optimiser's
    for (auto& [parameter, parameter_state] : states_) state[parameter] = std::move(parameter_state);
  }

 private:
  [[nodiscard]] std::string where(const std::string& entry) const {
    return "checkpoint '" + path_ + "': its optimiser state '" + entry + "'";
  }

  c10::IValue entry(const c10::impl::GenericDict& dict, const std::string& key, const std::string& owner) const {
    const auto it = dict.find(key);
    TORCH_CHECK(it != dict.end(), where(owner), " has no '", key, "'");
    return it->value();
  }

  double finite_number(const c10::IValue& value, const std::string& name) const {
    TORCH_CHECK(value.isDouble() || value.isInt(), where(name), " is not a number");
    const double number = value.isDouble() ? value.toDouble() : static_cast<double>(value.toInt());
    TORCH_CHECK(std::isfinite(number) && number >= 0, where(name), " is ", number,
                ": it must be finite and not negative");
    return number;
  }

  // The groups, their sizes and their parameter indices, mapped by position onto this optimiser's
  // parameters as torch.optim's load_state_dict maps them.
  void read_groups(const c10::IValue& value) {
    const auto& groups = optimizer_.param_groups();
    TORCH_CHECK(value.isList() && value.toListRef().size() == groups.size(), where("param_groups"),
                " does not hold ", groups.size(), " groups, as the optimiser built from the run's config has");
    const auto stored = value.toListRef();
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto name = "param_groups[" + std::to_string(g) + "]";
      TORCH_CHECK(stored[g].isGenericDict(), where(name), " is not a dict");
      const auto group = stored[g].toGenericDict();
      lrs_.push_back(finite_number(entry(group, "lr", name), name + ".lr"));
      const auto params = entry(group, "params", name);
      TORCH_CHECK(params.isList() && params.toListRef().size() == groups[g].params().size(), where(name),
                  " does not list ", groups[g].params().size(), " parameters, as the optimiser's group has");
      const auto indices = params.toListRef();
      for (size_t i = 0; i < indices.size(); ++i) {
        TORCH_CHECK(indices[i].isInt() && parameters_.count(indices[i].toInt()) == 0, where(name + ".params"),
                    " holds an index that is not an integer or appears twice");
        parameters_.emplace(indices[i].toInt(), groups[g].params()[i]);
      }
    }
  }

  void read_states(const c10::IValue& value) {
    TORCH_CHECK(value.isGenericDict(), where("state"), " is not a dict");
    const bool adamw = dynamic_cast<AdamW*>(&optimizer_) != nullptr;
    TORCH_CHECK(adamw || dynamic_cast<SGD*>(&optimizer_) != nullptr, "checkpoints hold the state of AdamW and SGD only");
    for (const auto& item : value.toGenericDict()) {
      TORCH_CHECK(item.key().isInt() && parameters_.count(item.key().toInt()) == 1, where("state"),
                  " has an entry for a parameter that no group lists");
      const auto index = item.key().toInt();
      const auto name = "state[" + std::to_string(index) + "]";
      TORCH_CHECK(item.value().isGenericDict(), where(name), " is not a dict");
      const auto& parameter = parameters_.at(index);
      auto state = adamw ? read_adamw(item.value().toGenericDict(), parameter, name)
                         : read_sgd(item.value().toGenericDict(), parameter, name);
      TORCH_CHECK(states_.emplace(parameter.unsafeGetTensorImpl(), std::move(state)).second, where(name),
                  " repeats a parameter");
    }
  }

  void expect_keys(const c10::impl::GenericDict& dict, const std::set<std::string>& allowed,
                   const std::string& name) const {
    for (const auto& item : dict) {
      TORCH_CHECK(item.key().isString() && allowed.count(item.key().toStringRef()) == 1, where(name),
                  " holds an entry this optimiser does not have");
    }
  }

  // A state tensor: the parameter's shape and dtype, finite, copied beside the parameter (a copy:
  // the file's tensors may share storage, and the optimiser updates its state in place).
  at::Tensor like_parameter(const c10::IValue& value, const at::Tensor& parameter, const std::string& name) const {
    TORCH_CHECK(value.isTensor(), where(name), " is not a tensor");
    const auto& tensor = value.toTensor();
    TORCH_CHECK(tensor.sizes() == parameter.sizes() && tensor.scalar_type() == parameter.scalar_type(), where(name),
                " is ", tensor.scalar_type(), " ", tensor.sizes(), " where its parameter is ",
                parameter.scalar_type(), " ", parameter.sizes());
    if (!allow_non_finite_) {
      TORCH_CHECK(at::isfinite(tensor).all().item<bool>(), where(name), " holds NaN or Inf values (the run that "
                  "wrote it diverged, or the file was altered); allow_non_finite (convnn: --allow-non-finite) "
                  "loads it anyway");
    }
    return tensor.to(parameter.device(), /*non_blocking=*/false, /*copy=*/true);
  }

  int64_t step_count(const c10::IValue& value, const std::string& name) const {
    TORCH_CHECK(value.isTensor() && value.toTensor().numel() == 1, where(name), " is not a scalar tensor");
    const double step = value.toTensor().to(at::kDouble).item<double>();
    TORCH_CHECK(std::isfinite(step) && step >= 0 && step <= kMaxStep && std::floor(step) == step, where(name),
                " is ", step, ": a step count is a whole number from 0 to 2^53");
    return static_cast<int64_t>(step);
  }

  std::unique_ptr<torch::optim::OptimizerParamState> read_adamw(const c10::impl::GenericDict& dict,
                                                                const at::Tensor& parameter,
                                                                const std::string& name) const {
    expect_keys(dict, {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, name);
    auto state = std::make_unique<AdamWParamState>();
    state->step(step_count(entry(dict, "step", name), name + ".step"));
    state->exp_avg(like_parameter(entry(dict, "exp_avg", name), parameter, name + ".exp_avg"));
    // A negative second moment is the square root of a negative number in the next step. Checked
    // on the file's (CPU) tensor: the parameter may be where values cannot be read (meta).
    const auto exp_avg_sq = entry(dict, "exp_avg_sq", name);
    TORCH_CHECK(!exp_avg_sq.isTensor() || !(exp_avg_sq.toTensor() < 0).any().item<bool>(),
                where(name + ".exp_avg_sq"), " holds negative values: it is a running mean of squares");
    state->exp_avg_sq(like_parameter(exp_avg_sq, parameter, name + ".exp_avg_sq"));
    const auto max = dict.find("max_exp_avg_sq");
    if (max != dict.end()) state->max_exp_avg_sq(like_parameter(max->value(), parameter, name + ".max_exp_avg_sq"));
    return state;
  }

  std::unique_ptr<torch::optim::OptimizerParamState> read_sgd(const c10::impl::GenericDict& dict,
                                                              const at::Tensor& parameter,
                                                              const std::string& name) const {
    expect_keys(dict, {"momentum_buffer"}, name);
    auto state = std::make_unique<SGDParamState>();
    const auto buffer = entry(dict, "momentum_buffer", name);
    if (!buffer.isNone()) state->momentum_buffer(like_parameter(buffer, parameter, name + ".momentum_buffer"));
    return state;
  }

  torch::optim::Optimizer& optimizer_;
  std::string path_;
  bool allow_non_finite_;
  std::vector<double> lrs_;
  std::map<int64_t, at::Tensor> parameters_;
  std::map<void*, std::unique_ptr<torch::optim::OptimizerParamState>> states_;
};

uint32_t crc32_update(uint32_t crc, const void* data, size_t size) {
  return static_cast<uint32_t>(::crc32_z(crc, static_cast<const Bytef*>(data), size));
}

uint32_t crc32_walk(uint32_t crc, const c10::IValue& value) {
  const auto text = [&](const std::string& s) { crc = crc32_update(crc, s.data(), s.size()); };
  if (value.isTensor()) {
    const auto bytes = value.toTensor().contiguous();
    text(std::string("T") + c10::toString(bytes.scalar_type()));
    return crc32_update(crc, bytes.data_ptr(), bytes.nbytes());
  }
  if (value.isGenericDict()) {
    text("{");
    for (const auto& item : value.toGenericDict()) {
      crc = crc32_walk(crc32_walk(crc, item.key()), item.value());
    }
    text("}");
  } else if (value.isList() || value.isTuple()) {
    text("[");
    const auto items = value.isList() ? value.toListRef().vec() : value.toTupleRef().elements().vec();
    for (const auto& item : items) crc = crc32_walk(crc, item);
    text("]");
  } else if (value.isString()) {
    text("S" + value.toStringRef());
  } else if (value.isDouble()) {
    const double number = value.toDouble();
    crc = crc32_update(crc, &number, sizeof(number));
  } else if (value.isInt()) {
    const int64_t number = value.toInt();
    crc = crc32_update(crc, &number, sizeof(number));
  } else if (value.isBool()) {
    text(value.toBool() ? "t" : "f");
  } else {
    TORCH_CHECK(value.isNone(), "crc32_of_value: a value of type ", value.tagKind(), " is not plain data");
    text("N");
  }
  return crc;
}

}  // namespace

c10::IValue optimizer_state_dict(torch::optim::Optimizer& optimizer) {
  auto state = new_dict();
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    auto stored = group_options(group.options());
    c10::impl::GenericList params(c10::AnyType::get());
    for (const auto& parameter : group.params()) {
      const auto it = optimizer.state().find(parameter.unsafeGetTensorImpl());
      if (it != optimizer.state().end()) state.insert(index, parameter_state(*it->second));
      params.push_back(index++);
    }
    stored.insert("params", params);
    groups.push_back(stored);
  }
  auto state_dict = new_dict();
  state_dict.insert("state", state);
  state_dict.insert("param_groups", groups);
  return state_dict;
}

std::function<void()> prepare_optimizer_state(torch::optim::Optimizer& optimizer, const c10::IValue& state_dict,
                                              const std::string& path, bool allow_non_finite) {
  auto reader = std::make_shared<StateReader>(optimizer, path, allow_non_finite);
  reader->read(state_dict);
  return [reader] { reader->apply(); };
}

uint32_t crc32_of_value(const c10::IValue& value) { return crc32_walk(0, value); }

}  // namespace convnn::checkpoint::detail
