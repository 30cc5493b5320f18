// Checkpoints and the training loop on small real data: a round trip restores everything, a
// resumed run repeats the uninterrupted one exactly, and a short run learns.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include "convnn/checkpoint/checkpoint.h"
#include "convnn/train/optim.h"
#include "convnn/train/trainer.h"
#include "checkpoint/torch_file.h"
#include "data/fixtures.h"
#include "train/loss_recorder.h"

namespace convnn::train {
namespace {

using namespace convnn::checkpoint;
using testing_support::LossRecorder;

namespace fs = std::filesystem;
const char* kFashionMnist = "/usr/share/datasets/fashion-mnist";

// A ViT small enough to train in a second, with dropout so that resuming must restore the RNG.
TrainConfig tiny_vit_config(const std::string& output) {
  TrainConfig c;
  c.model = "vit_tiny";
  c.model_config.vit.attention = models::ViTAttention::ConvNN;
  c.model_config.convnn.k = 4;
  c.model_config.vit.patch_size = 7;
  c.model_config.vit.depth = 1;
  c.model_config.vit.embed_dim = 32;
  c.model_config.vit.num_heads = 2;
  c.model_config.vit.dropout = 0.1;
  c.data.data_dir = kFashionMnist;
  c.data.train_subset = 640;
  c.data.val_subset = 200;
  c.optimization.batch_size = 64;
  c.optimization.epochs = 2;
  c.optimization.warmup_epochs = 0.5;
  c.optimization.lr = 3e-3;
  c.data.workers = 2;
  c.run.output = output;
  c.run.experiment = "run";
  return c;
}

#define SKIP_WITHOUT_FASHION_MNIST()                                              \
  if (!fs::exists(kFashionMnist)) GTEST_SKIP() << kFashionMnist << " is not installed"

TEST(Checkpoint, RoundTripRestoresModelOptimizerAndRng) {
  testing::TempDir dir;
  TrainConfig config;
  torch::manual_seed(1);
  auto model = torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::LayerNorm(std::vector<int64_t>{3}));
  auto optimizer = make_optimizer(config.optimization, *model.ptr());
  model->forward(torch::randn({2, 4})).sum().backward();
  optimizer->step();
  TrainingPosition position;
  position.epoch = 3;
  position.next_batch = 7;
  position.step = 42;
  position.totals.loss_sum = 1.25;
  const auto path = dir.file("checkpoint.pt");
  save_checkpoint(path, config, position, *model.ptr(), *optimizer);
  const auto after_save = torch::rand({3});

  torch::manual_seed(2);
  auto other = torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::LayerNorm(std::vector<int64_t>{3}));
  auto other_optimizer = make_optimizer(config.optimization, *other.ptr());
  load_checkpoint(path, *other.ptr(), other_optimizer.get());
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(model->parameters()[i], other->parameters()[i]));
  }
  EXPECT_TRUE(torch::equal(torch::rand({3}), after_save));  // the RNG continues from the save
  // The restored AdamW state steps both models identically.
  optimizer->zero_grad();
  other_optimizer->zero_grad();
  for (auto* m : {&model, &other}) (*m)->forward(torch::ones({2, 4})).sum().backward();
  optimizer->step();
  other_optimizer->step();
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(model->parameters()[i], other->parameters()[i]));
  }
  const auto header = read_checkpoint_header(path);
  EXPECT_EQ(header.position.epoch, 3);
  EXPECT_EQ(header.position.next_batch, 7);
  EXPECT_EQ(header.position.step, 42);
  EXPECT_DOUBLE_EQ(header.position.totals.loss_sum, 1.25);
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path().filename(), "checkpoint.pt") << "temporary file left behind";
  }
}

const torch::optim::AdamWParamState& adamw_state(torch::optim::Optimizer& optimizer, const at::Tensor& p) {
  const auto& state = *optimizer.state().at(p.unsafeGetTensorImpl());
  return static_cast<const torch::optim::AdamWParamState&>(state);
}

// A Linear + LayerNorm after one AdamW step, saved to `path`; returns the saved model.
torch::nn::Sequential save_stepped_model(const std::string& path, const c10::Device& device) {
  TrainConfig config;
  torch::manual_seed(1);
  auto model = torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::LayerNorm(std::vector<int64_t>{3}));
  model->to(device);
  auto optimizer = make_optimizer(config.optimization, *model.ptr());
  model->forward(torch::randn({2, 4}).to(device)).sum().backward();
  optimizer->step();
  save_checkpoint(path, config, {}, *model.ptr(), *optimizer);
  // Saving copied the state to the CPU for the file only.
  for (const auto& p : model->parameters()) {
    const auto& state = adamw_state(*optimizer, p);
    EXPECT_EQ(state.exp_avg().device(), device);
  }
  return model;
}

// The AdamW state of each parameter of `model` after load_checkpoint: on the parameter's device.
std::vector<torch::optim::AdamWParamState> loaded_state(const std::string& path,
                                                        torch::nn::Sequential model) {
  auto optimizer = make_optimizer(OptimizationConfig{}, *model.ptr());
  load_checkpoint(path, *model.ptr(), optimizer.get());
  std::vector<torch::optim::AdamWParamState> states;
  for (const auto& p : model->parameters()) {
    const auto& state = adamw_state(*optimizer, p);
    EXPECT_EQ(state.exp_avg().device(), p.device());
    EXPECT_EQ(state.exp_avg_sq().device(), p.device());
    EXPECT_EQ(state.step(), 1);
    states.push_back(state);
  }
  return states;
}

torch::nn::Sequential fresh_model(const c10::Device& device) {
  auto model = torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::LayerNorm(std::vector<int64_t>{3}));
  model->to(device);
  return model;
}

// Sequential(Linear(4, 3), LayerNorm(3))'s parameters by name and shape, made on `device`
// (Module::to cannot move parameters to meta).
std::shared_ptr<torch::nn::Module> parameters_on(const c10::Device& device) {
  const auto on = torch::TensorOptions().device(device);
  auto root = std::make_shared<torch::nn::Module>();
  auto linear = std::make_shared<torch::nn::Module>(), norm = std::make_shared<torch::nn::Module>();
  linear->register_parameter("weight", torch::zeros({3, 4}, on));
  linear->register_parameter("bias", torch::zeros({3}, on));
  norm->register_parameter("weight", torch::ones({3}, on));
  norm->register_parameter("bias", torch::zeros({3}, on));
  root->register_module("0", linear);
  root->register_module("1", norm);
  return root;
}

// Meta stands in for an accelerator on machines without one: the state moves, the step stays.
TEST(Checkpoint, OptimizerStateFollowsTheParametersToAnotherDevice) {
  testing::TempDir dir;
  const auto path = dir.file("checkpoint.pt");
  save_stepped_model(path, c10::kCPU);
  const auto on_meta = parameters_on(c10::kMeta);
  auto optimizer = make_optimizer(OptimizationConfig{}, *on_meta);
  load_checkpoint(path, *on_meta, optimizer.get());
  const auto parameters = on_meta->parameters();
  ASSERT_EQ(parameters.size(), 4u);
  for (const auto& p : parameters) {
    ASSERT_TRUE(p.is_meta());
    const auto& state = adamw_state(*optimizer, p);
    EXPECT_TRUE(state.exp_avg().is_meta() && state.exp_avg_sq().is_meta());
    EXPECT_EQ(state.step(), 1);
  }
}

// Written on CUDA, the file holds CPU tensors; it loads onto the CPU and back onto CUDA bit for bit.
TEST(Checkpoint, CudaCheckpointsLoadOnTheCpuAndBack) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device in this process";
  testing::TempDir dir;
  const auto path = dir.file("checkpoint.pt");
  const c10::Device cuda(c10::kCUDA, 0);
  const auto model = save_stepped_model(path, cuda);
  const auto on_cpu = loaded_state(path, fresh_model(c10::kCPU));
  const auto on_cuda = loaded_state(path, fresh_model(cuda));
  for (size_t i = 0; i < on_cpu.size(); ++i) {
    EXPECT_TRUE(torch::equal(on_cpu[i].exp_avg(), on_cuda[i].exp_avg().cpu())) << "parameter " << i;
    EXPECT_TRUE(torch::equal(on_cpu[i].exp_avg_sq(), on_cuda[i].exp_avg_sq().cpu())) << "parameter " << i;
  }
  auto reloaded = fresh_model(c10::kCPU);
  load_checkpoint(path, *reloaded.ptr(), nullptr);
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(model->parameters()[i].cpu(), reloaded->parameters()[i]));
  }
}

TEST(Checkpoint, MismatchedModelAndDamagedFilesAreClearErrors) {
  testing::TempDir dir;
  TrainConfig config;
  auto model = torch::nn::Linear(4, 3);
  auto optimizer = make_optimizer(config.optimization, *model.ptr());
  const auto path = dir.file("checkpoint.pt");
  save_checkpoint(path, config, {}, *model.ptr(), *optimizer);
  auto wider = torch::nn::Linear(4, 5);
  testing::expect_error([&] { load_checkpoint(path, *wider.ptr(), nullptr); }, path, "does not fit the model");
  testing::expect_error([&] { load_checkpoint(dir.file("none.pt"), *model.ptr(), nullptr); },
                        dir.file("none.pt"), "does not exist");
  const auto truncated = dir.file("truncated.pt");
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  testing::write_file(truncated, testing::Bytes(bytes.begin(), bytes.begin() + bytes.size() / 2));
  testing::expect_error([&] { read_checkpoint_header(truncated); }, truncated, "cannot be read");
}

// A stop right after an epoch's last batch (before its evaluation) saves next_batch equal to the
// epoch's batch count, which resume must accept (the position check once refused it).
TEST(Training, AStopAfterAnEpochsLastBatchResumes) {
  SKIP_WITHOUT_FASHION_MNIST();
  testing::TempDir dir;
  TrainHooks stop;
  stop.max_steps = 10;  // the last of epoch 1's 10 batches
  const auto config = tiny_vit_config(dir.file("runs"));
  ASSERT_TRUE(train(config, "", stop).interrupted);
  const auto latest = latest_checkpoint_path(dir.file("runs") + "/run");
  EXPECT_EQ(read_checkpoint_header(latest).position.next_batch, 10);
  const auto finished = train(config, latest);
  EXPECT_FALSE(finished.interrupted);
  EXPECT_EQ(finished.epochs.size(), 2u);
}

TEST(Training, ResumedRunRepeatsTheUninterruptedLossTrajectory) {
  SKIP_WITHOUT_FASHION_MNIST();
  testing::TempDir dir;
  std::vector<double> whole, resumed;
  LossRecorder whole_losses(whole), resumed_losses(resumed);
  TrainHooks record;
  record.sinks.push_back(&whole_losses);
  const auto full = train(tiny_vit_config(dir.file("a")), "", record);
  ASSERT_FALSE(full.interrupted);

  TrainHooks interrupted;
  interrupted.sinks.push_back(&resumed_losses);
  interrupted.max_steps = 13;  // mid-epoch 2 (10 batches per epoch)
  const auto config = tiny_vit_config(dir.file("b"));
  ASSERT_TRUE(train(config, "", interrupted).interrupted);
  TrainHooks rest;
  rest.sinks = interrupted.sinks;
  const auto finished = train(config, latest_checkpoint_path(dir.file("b") + "/run"), rest);
  ASSERT_FALSE(finished.interrupted);
  ASSERT_EQ(resumed.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_EQ(resumed[i], whole[i]) << "batch " << i;
  ASSERT_EQ(finished.epochs.size(), full.epochs.size());
  EXPECT_EQ(finished.epochs.back().val_top1, full.epochs.back().val_top1);
  EXPECT_EQ(finished.epochs.back().train_loss, full.epochs.back().train_loss);
}

TEST(Training, ShortRunBeatsChanceByAWideMargin) {
  SKIP_WITHOUT_FASHION_MNIST();
  testing::TempDir dir;
  auto config = tiny_vit_config(dir.file("runs"));
  config.data.train_subset = 2000;
  config.data.val_subset = 500;
  config.optimization.epochs = 3;
  const auto result = train(config);
  EXPECT_GT(result.final_eval.top1, 30.0) << "chance is 10%";  // measured: 42.8%
  EXPECT_EQ(result.epochs.size(), 3u);
  const auto run = fs::path(result.run_dir);
  for (const char* file : {"config.json", "metrics.csv", "metrics.json", "checkpoint-latest.pt", "checkpoint-best.pt"}) {
    EXPECT_TRUE(fs::exists(run / file)) << file;
  }
  // The effective config reproduces the run's model.
  const auto saved = read_config((run / "config.json").string());
  EXPECT_EQ(saved.model_config.image_size, 28);
  EXPECT_EQ(saved.model_config.num_classes, 10);
}

TEST(Training, StartingOverAFinishedRunIsRefused) {
  SKIP_WITHOUT_FASHION_MNIST();
  testing::TempDir dir;
  auto config = tiny_vit_config(dir.file("runs"));
  config.optimization.epochs = 1;
  config.data.train_subset = 64;
  train(config);
  testing::expect_error([&] { train(config); }, dir.file("runs") + "/run", "already holds a run");
}

bool cuda_present() { return torch::cuda::is_available(); }

// A tiny ViT's config with the sizes resolve_config would take from Fashion-MNIST.
TrainConfig resolved_tiny_vit_config(const std::string& output) {
  auto config = tiny_vit_config(output);
  config.model_config.num_classes = 10;
  config.model_config.in_channels = 1;
  config.model_config.image_size = 28;
  return config;
}

void expect_model_on(models::Model& model, const c10::Device& device) {
  for (const auto& p : model.module()->named_parameters()) EXPECT_EQ(p.value().device(), device) << p.key();
  for (const auto& b : model.module()->named_buffers()) EXPECT_EQ(b.value().device(), device) << b.key();
}

// Every parameter and buffer is on the requested device. (Not meta: C++'s Module::to cannot move
// parameters there, and training needs values.)
TEST(Device, TheModelIsOnTheRequestedDevice) {
  const c10::Device cpu(c10::kCPU);
  auto model = make_model(resolved_tiny_vit_config("unused"), cpu);
  expect_model_on(model, cpu);
}

// Initialised on the CPU then moved: one seed gives the same weights on CUDA as on the CPU.
TEST(Device, TheModelIsOnCudaWithTheCpuInitialisation) {
  if (!cuda_present()) GTEST_SKIP() << "no CUDA device in this process";
  const auto config = resolved_tiny_vit_config("unused");
  torch::manual_seed(5);
  auto on_cpu = make_model(config, c10::kCPU);
  torch::manual_seed(5);
  auto on_cuda = make_model(config, c10::Device(c10::kCUDA, 0));
  expect_model_on(on_cuda, c10::Device(c10::kCUDA, 0));
  const auto cpu_parameters = on_cpu.module()->parameters(), cuda_parameters = on_cuda.module()->parameters();
  for (size_t i = 0; i < cpu_parameters.size(); ++i) {
    EXPECT_TRUE(torch::equal(cpu_parameters[i], cuda_parameters[i].cpu())) << "parameter " << i;
  }
}

// An accelerator that is not there is refused before anything is read or written.
TEST(Device, AnAbsentDeviceIsRefusedBeforeTheRunFolderIsMade) {
  if (cuda_present()) GTEST_SKIP() << "a CUDA device is present: it would be used";
  testing::TempDir dir;
  const auto config = tiny_vit_config(dir.file("runs"));
  const c10::Device cuda(c10::kCUDA);
  testing::expect_error([&] { train(config, "", {}, false, cuda); }, "device cuda",
                        "no cuda device is available");
  testing::expect_error([&] { make_model(resolved_tiny_vit_config(""), cuda); }, "device cuda",
                        "no cuda device is available");
  testing::expect_error(
      [&] {
        evaluate_checkpoint(dir.file("none.pt"), config, data::Split::Test, Precision::Float32, false, cuda);
      },
      "device cuda", "no cuda device is available");
  // Meta tensors hold no values for a checkpoint to save.
  testing::expect_error([&] { train(config, "", {}, false, c10::kMeta); }, "device meta", "no meta device");
  testing::expect_error([&] { make_model(resolved_tiny_vit_config(""), c10::kMeta); }, "device meta",
                        "no meta device");
  EXPECT_FALSE(fs::exists(dir.file("runs")));
}

// The model and the optimiser state are CPU tensors: every storage of the file is recorded as a
// CPU one (the pickle names each storage's device), and the optimiser's state has tensors.
void expect_cpu_checkpoint(const std::string& path) {
  const auto pickle = read_torch_file_record(path, "data.pkl", uint64_t{1} << 30);
  ASSERT_TRUE(pickle.has_value()) << path;
  EXPECT_NE(pickle->find("cpu"), std::string::npos) << path;
  EXPECT_EQ(pickle->find("cuda"), std::string::npos) << path << " records a CUDA storage";
  const auto contents = read_torch_file(path).toGenericDict();
  int64_t tensors = 0;
  for (const auto& parameter : contents.at("optimizer").toGenericDict().at("state").toGenericDict()) {
    for (const auto& entry : parameter.value().toGenericDict()) {
      if (!entry.value().isTensor()) continue;
      EXPECT_TRUE(entry.value().toTensor().device().is_cpu()) << path << ": " << entry.key().toStringRef();
      ++tensors;
    }
  }
  EXPECT_GT(tensors, 0) << "no optimiser state in " << path;
}

TEST(Device, CpuCheckpointsHoldCpuTensors) {
  SKIP_WITHOUT_FASHION_MNIST();
  testing::TempDir dir;
  auto config = tiny_vit_config(dir.file("runs"));
  TrainHooks stop;
  stop.max_steps = 3;
  ASSERT_TRUE(train(config, "", stop).interrupted);
  expect_cpu_checkpoint(latest_checkpoint_path(dir.file("runs") + "/run"));
}

// A run stopped on one device finishes on the other, both ways; the checkpoints written on CUDA
// hold CPU tensors. Not bitwise: CUDA's kernels round differently from the CPU's.
TEST(Device, ARunMovesBetweenCudaAndCpu) {
  if (!cuda_present()) GTEST_SKIP() << "no CUDA device in this process";
  SKIP_WITHOUT_FASHION_MNIST();
  const c10::Device cuda(c10::kCUDA, 0), cpu(c10::kCPU);
  for (const bool cuda_first : {true, false}) {
    testing::TempDir dir;
    const auto config = tiny_vit_config(dir.file("runs"));
    TrainHooks stop;
    stop.max_steps = 13;  // mid-epoch 2
    ASSERT_TRUE(train(config, "", stop, false, cuda_first ? cuda : cpu).interrupted);
    const auto latest = latest_checkpoint_path(dir.file("runs") + "/run");
    expect_cpu_checkpoint(latest);
    const auto finished = train(config, latest, {}, false, cuda_first ? cpu : cuda);
    EXPECT_FALSE(finished.interrupted);
    EXPECT_EQ(finished.epochs.size(), 2u);
    EXPECT_TRUE(std::isfinite(finished.epochs.back().train_loss));
    expect_cpu_checkpoint(latest);
    const auto stored = read_checkpoint_header(latest).config;
    const auto evaluation =
        evaluate_checkpoint(latest, stored, data::Split::Test, Precision::Float32, false, cuda);
    EXPECT_NEAR(evaluation.top1, finished.final_eval.top1, 2.0);  // 4 of 200 images
  }
}

TEST(Training, WrongDatasetPathNamesThePath) {
  testing::TempDir dir;
  auto config = tiny_vit_config(dir.file("runs"));
  config.data.data_dir = dir.file("nowhere");
  testing::expect_error([&] { train(config); }, dir.file("nowhere"), "");
}

}  // namespace
}  // namespace convnn::train
