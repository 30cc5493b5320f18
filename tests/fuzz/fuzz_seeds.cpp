// The fuzz targets' seed corpus, written by convnn's own writers into two folders (argv[1]:
// checkpoints, argv[2]: configs): a run's checkpoint (format 4) of a small model with AdamW state,
// weights alone as Python's torch.save(model.state_dict()) writes them, values that share
// references, the default config and a config with every option set. Generated, so that no binary file is committed.
#include <torch/nn/modules/linear.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "convnn/checkpoint/checkpoint.h"
#include "convnn/train/optim.h"
#include "checkpoint/torch_file.h"

namespace fs = std::filesystem;
using namespace convnn::train;
using namespace convnn::checkpoint;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: fuzz_seeds CHECKPOINT_DIR CONFIG_DIR\n";
    return 2;
  }
  const fs::path checkpoints(argv[1]), configs(argv[2]);
  fs::create_directories(checkpoints);
  fs::create_directories(configs);
  torch::nn::Linear linear(4, 3);
  auto optimizer = make_optimizer(OptimizationConfig{}, *linear.ptr());
  linear->forward(torch::ones({2, 4})).sum().backward();
  optimizer->step();
  TrainingPosition position;
  position.epoch = 1;
  position.step = 1;
  save_checkpoint((checkpoints / "run.pt").string(), TrainConfig{}, position, *linear.ptr(), *optimizer);
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  for (const auto& item : linear->named_parameters()) state.insert(item.key(), item.value().detach());
  std::ofstream(checkpoints / "state_dict.pt", std::ios::binary) << torch_save_bytes(state);
  // Values that share references (each tuple holds the one inside it twice; the writer memoises
  // them): 2^13 - 1 values expanded, within the reader's budget, for the fuzzer to grow past it.
  c10::IValue shared = c10::impl::GenericList(c10::AnyType::get());
  for (int level = 0; level < 12; ++level) shared = c10::ivalue::Tuple::create({shared, shared});
  std::ofstream(checkpoints / "shared_references.pt", std::ios::binary) << torch_save_bytes(shared);
  std::ofstream(configs / "default.json") << nlohmann::json(TrainConfig{}).dump(2);
  TrainConfig full;
  full.model = "vit_tiny";
  full.model_config.vit.attention = convnn::models::ViTAttention::ConvNN;
  full.augmentation.mixup = 0.2;
  full.augmentation.hflip = 0.5;
  std::ofstream(configs / "vit.json") << nlohmann::json(full).dump(2);
  return 0;
}
