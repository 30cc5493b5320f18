#include "convnn/train/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/List.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

namespace convnn::train {
namespace {

constexpr int64_t kFormatVersion = 1;

// Parameters then buffers, by their full names: the order load checks against.
std::vector<std::pair<std::string, at::Tensor>> named_state(torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (const auto& item : model.named_parameters(true)) state.emplace_back(item.key(), item.value());
  for (const auto& item : model.named_buffers(true)) state.emplace_back(item.key(), item.value());
  return state;
}

nlohmann::json position_to_json(const TrainingPosition& p) {
  return {{"epoch", p.epoch},       {"next_batch", p.next_batch}, {"step", p.step},
          {"best_top1", p.best_top1}, {"best_epoch", p.best_epoch}, {"loss_sum", p.loss_sum},
          {"samples", p.samples},   {"correct", p.correct},       {"seconds", p.seconds},
          {"skipped", p.skipped}};
}

TrainingPosition position_from_json(const nlohmann::json& j) {
  TrainingPosition p;
  p.epoch = j.at("epoch");
  p.next_batch = j.at("next_batch");
  p.step = j.at("step");
  p.best_top1 = j.at("best_top1");
  p.best_epoch = j.at("best_epoch");
  p.loss_sum = j.at("loss_sum");
  p.samples = j.at("samples");
  p.correct = j.at("correct");
  p.seconds = j.at("seconds");
  p.skipped = j.value("skipped", int64_t{0});  // absent from checkpoints of older versions
  return p;
}

torch::serialize::InputArchive open_archive(const std::string& path) {
  TORCH_CHECK(std::filesystem::is_regular_file(path), "checkpoint '", path, "' does not exist");
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "checkpoint '", path, "' cannot be read (not a convnn checkpoint, or damaged): ",
                e.msg());
  }
  return archive;
}

nlohmann::json read_header(torch::serialize::InputArchive& archive, const std::string& path) {
  c10::IValue header;
  TORCH_CHECK(archive.try_read("convnn_header", header) && header.isString(),
              "checkpoint '", path, "' has no convnn header (not written by convnn train)");
  auto json = nlohmann::json::parse(header.toStringRef());
  TORCH_CHECK(json.value("format", int64_t{0}) == kFormatVersion, "checkpoint '", path,
              "' has format ", json.value("format", int64_t{0}), "; this convnn reads format ",
              kFormatVersion);
  return json;
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& contents) {
  const auto target = std::filesystem::path(path);
  const auto temporary = target.parent_path() / ("." + target.filename().string() + ".tmp" +
                                                 std::to_string(::getpid()));
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    TORCH_CHECK(out, "cannot write '", temporary.string(), "'");
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    out.flush();
    TORCH_CHECK(out, "writing '", temporary.string(), "' failed (disk full?)");
  }
  std::error_code error;
  std::filesystem::rename(temporary, target, error);
  if (error) std::filesystem::remove(temporary);
  TORCH_CHECK(!error, "cannot move '", temporary.string(), "' to '", path, "': ", error.message());
}

void save_checkpoint(const std::string& path, const TrainConfig& config,
                     const TrainingPosition& position, torch::nn::Module& model,
                     torch::optim::Optimizer& optimizer) {
  nlohmann::json header{{"format", kFormatVersion}, {"config", config},
                        {"position", position_to_json(position)}};
  c10::List<at::Tensor> tensors;
  auto& names = header["tensors"] = nlohmann::json::array();
  for (const auto& [name, tensor] : named_state(model)) {
    names.push_back(name);
    tensors.push_back(tensor.detach().cpu());
  }
  torch::serialize::OutputArchive archive;
  archive.write("convnn_header", c10::IValue(header.dump()));
  archive.write("model", c10::IValue(tensors));
  torch::serialize::OutputArchive optimizer_archive;
  optimizer.save(optimizer_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("rng_cpu", at::detail::getDefaultCPUGenerator().get_state(), /*is_buffer=*/true);
  std::ostringstream bytes;
  archive.save_to(bytes);
  write_file_atomically(path, bytes.str());
}

Checkpoint read_checkpoint_header(const std::string& path) {
  auto archive = open_archive(path);
  const auto header = read_header(archive, path);
  Checkpoint checkpoint;
  try {
    from_json(header.at("config"), checkpoint.config);
    checkpoint.position = position_from_json(header.at("position"));
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "checkpoint '", path, "' has a damaged header: ", e.what());
  }
  return checkpoint;
}

void load_checkpoint(const std::string& path, torch::nn::Module& model,
                     torch::optim::Optimizer* optimizer) {
  auto archive = open_archive(path);
  const auto header = read_header(archive, path);
  c10::IValue stored;
  TORCH_CHECK(archive.try_read("model", stored) && stored.isTensorList(), "checkpoint '", path,
              "' holds no model tensors");
  const auto tensors = stored.toTensorList();
  const auto& names = header.at("tensors");
  auto state = named_state(model);
  TORCH_CHECK(names.size() == tensors.size() && names.size() == state.size(), "checkpoint '", path,
              "' holds ", names.size(), " tensors but the model has ", state.size(),
              ": it was written for a different model");
  for (size_t i = 0; i < state.size(); ++i) {
    const auto& [name, target] = state[i];
    const at::Tensor source = tensors.get(i);
    TORCH_CHECK(names[i].get<std::string>() == name && source.sizes() == target.sizes(),
                "checkpoint '", path, "' does not fit the model: it holds '", names[i].get<std::string>(),
                "' ", source.sizes(), " where the model has '", name, "' ", target.sizes());
  }
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < state.size(); ++i) state[i].second.copy_(tensors.get(i));
  }
  if (optimizer == nullptr) return;
  torch::serialize::InputArchive optimizer_archive;
  TORCH_CHECK(archive.try_read("optimizer", optimizer_archive), "checkpoint '", path,
              "' holds no optimiser state");
  optimizer->load(optimizer_archive);
  at::Tensor rng;
  TORCH_CHECK(archive.try_read("rng_cpu", rng, /*is_buffer=*/true), "checkpoint '", path,
              "' holds no RNG state");
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(rng);
}

std::string latest_checkpoint_path(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / "checkpoint-latest.pt").string();
}

std::string best_checkpoint_path(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / "checkpoint-best.pt").string();
}

}  // namespace convnn::train
