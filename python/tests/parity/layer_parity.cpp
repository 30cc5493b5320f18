// The C++ side of the Python/C++ equality tests (python/tests/test_parity.py): reads a case that
// Python wrote with torch.save, builds the C++ layer from the same option texts, loads the same
// weights, runs forward and backward, and writes the output and every gradient with
// torch::pickle_save, which torch.load reads.
//
//   convnn_layer_parity CASE.pt RESULT.pt
//
// CASE: {"layer": str, "options": [str], "state": {name: tensor}, "input": tensor,
//        "grad_output": tensor, "training": bool}; or "model": str and "config": str (JSON, the
//        registry's model options) instead of "layer" and "options"; optional "seed": the default
//        generator's seed right before forward
// RESULT: {"output": tensor, "input_grad": tensor, "grads": {name: tensor, for those that have one}}
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>
#include <memory>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "convnn/models/registry.h"
#include "nn/layer_ops.h"

namespace {

c10::Dict<c10::IValue, c10::IValue> read_case(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "cannot read ", path);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return torch::pickle_load(bytes).toGenericDict();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: convnn_layer_parity CASE.pt RESULT.pt\n";
    return 2;
  }
  try {
    const auto c = read_case(argv[1]);
    std::shared_ptr<torch::nn::Module> module_ptr;
    std::function<at::Tensor(const at::Tensor&)> forward;
    if (c.contains("model")) {
      const auto config = nlohmann::json::parse(c.at("config").toStringRef()).get<convnn::models::ModelConfig>();
      auto model = std::make_shared<convnn::models::Model>(
          convnn::models::build_model(c.at("model").toStringRef(), config));
      module_ptr = model->module();
      forward = [model](const at::Tensor& x) { return model->forward(x); };
    } else {
      std::vector<std::string> options;
      for (const c10::IValue text : c.at("options").toList()) options.push_back(text.toStringRef());
      auto layer = std::make_shared<torch::nn::AnyModule>(
          convnn::nn::detail::make_layer(c.at("layer").toStringRef(), options));
      module_ptr = layer->ptr();
      forward = [layer](const at::Tensor& x) { return layer->forward(x); };
    }
    auto& module = *module_ptr;
    module.train(c.at("training").toBool());
    module.to(c.at("input").toTensor().scalar_type());
    {
      torch::NoGradGuard no_grad;
      const auto state = c.at("state").toGenericDict();
      for (auto& item : module.named_parameters(/*recurse=*/true)) {
        item.value().copy_(state.at(item.key()).toTensor());
      }
      for (auto& item : module.named_buffers(/*recurse=*/true)) {
        item.value().copy_(state.at(item.key()).toTensor());
      }
    }
    // The default generator's seed right before forward (random candidates in training draw from it).
    if (c.contains("seed")) torch::manual_seed(static_cast<uint64_t>(c.at("seed").toInt()));
    const auto input = c.at("input").toTensor().clone().requires_grad_(true);
    const auto output = forward(input);
    output.backward(c.at("grad_output").toTensor());

    c10::Dict<std::string, at::Tensor> grads;
    // A parameter without a gradient (e.g. the query projection under uniform rho) is left out,
    // as Python's grad is None.
    for (const auto& item : module.named_parameters(/*recurse=*/true)) {
      if (item.value().grad().defined()) grads.insert(item.key(), item.value().grad());
    }
    c10::impl::GenericDict result(c10::StringType::get(), c10::AnyType::get());
    result.insert("output", output.detach());
    result.insert("input_grad", input.grad());
    result.insert("grads", grads);
    const auto bytes = torch::pickle_save(result);
    std::ofstream(argv[2], std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "convnn_layer_parity: " << e.what() << "\n";
    return 1;
  }
}
