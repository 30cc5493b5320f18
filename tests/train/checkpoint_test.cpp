// Checkpoints that cannot be silently damaged or lost: every record is checksummed (torch's zip
// reader does not check the archive's CRCs), NaN/Inf weights are refused unless asked for, older
// and newer formats are handled, and a failed or killed write leaves no temporary file behind.
// (The round trip of model, optimiser and RNG is Checkpoint.RoundTripRestoresModelOptimizerAndRng
// in trainer_test.cpp.)
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "convnn/checkpoint/checkpoint.h"
#include "convnn/train/optim.h"
#include "convnn/train/trainer.h"
#include "data/fixtures.h"
#include "checkpoint/records.h"
#include "checkpoint/torch_file.h"

namespace convnn::train {
namespace {

using namespace convnn::checkpoint;

namespace fs = std::filesystem;
using testing::Bytes;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  testing::write_file(path, Bytes(bytes.begin(), bytes.end()));
}

// Flips one byte in the middle of where `pattern` lies in the file: a bit rot the zip container
// does not notice.
void flip_byte_inside(const std::string& path, const std::string& pattern) {
  auto bytes = read_bytes(path);
  const auto at = bytes.find(pattern);
  ASSERT_NE(at, std::string::npos) << "the record's bytes are not stored verbatim in " << path;
  ASSERT_EQ(bytes.find(pattern, at + 1), std::string::npos) << "the record's bytes are not unique";
  bytes[at + pattern.size() / 2] ^= 0x5A;
  write_bytes(path, bytes);
}

std::string bytes_of(const at::Tensor& tensor) {
  const auto t = tensor.detach().contiguous();
  return {static_cast<const char*>(t.data_ptr()), t.nbytes()};
}

// A linear layer with weights no other record holds, and AdamW state after one step.
struct SmallModel {
  torch::nn::Linear linear{16, 16};
  std::unique_ptr<torch::optim::Optimizer> optimizer;

  SmallModel() {
    torch::NoGradGuard no_grad;
    linear->weight.copy_(torch::arange(256, torch::kFloat).reshape({16, 16}) * 0.25 + 1000);
    linear->bias.fill_(0.5);
  }
  void step() {
    optimizer = make_optimizer(OptimizationConfig{}, *linear.ptr());
    linear->forward(torch::ones({2, 16})).sum().backward();
    optimizer->step();
  }
  torch::optim::AdamWParamState& adamw_state_of(const at::Tensor& parameter) {
    for (auto& [key, state] : optimizer->state()) {
      auto& adamw = dynamic_cast<torch::optim::AdamWParamState&>(*state);
      if (adamw.exp_avg().sizes() == parameter.sizes()) return adamw;
    }
    throw std::runtime_error("no AdamW state for the parameter");
  }
  void save(const std::string& path) { save_checkpoint(path, TrainConfig{}, {}, *linear.ptr(), *optimizer); }
};

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Proves each record has its own checksum: a byte flipped inside the weight, the optimiser state,
// the RNG state or the header loads without complaint from torch (its zip reader skips the CRCs),
// and convnn reports the file and the record, and changes nothing.
TEST(CheckpointIntegrity, AByteFlippedInAnyRecordIsAnErrorNamingTheFileAndTheRecord) {
  testing::TempDir dir;
  SmallModel model;
  model.step();
  const auto exp_avg = model.adamw_state_of(model.linear->weight).exp_avg().clone();
  const auto weight = model.linear->weight.detach().clone();
  const std::vector<std::pair<std::string, std::string>> records{
      {"weight", bytes_of(weight)},
      {"optimizer", bytes_of(exp_avg)},
      {"rng_cpu", ""},  // the state at the save, below
      {"convnn_header", "\"step\":0"}};
  for (const auto& [record, pattern] : records) {
    SCOPED_TRACE(record);
    const auto path = dir.file(record + ".pt");
    const auto rng_state = at::detail::getDefaultCPUGenerator().get_state();
    model.save(path);
    flip_byte_inside(path, pattern.empty() ? bytes_of(rng_state) : pattern);
    SmallModel other;
    other.step();
    const auto before = other.linear->weight.detach().clone();
    testing::expect_error([&] { load_checkpoint(path, *other.linear.ptr(), other.optimizer.get()); },
                          path, "is damaged: record '" + record + "'");
    EXPECT_TRUE(torch::equal(other.linear->weight, before)) << "a failed load changed the model";
  }
}

// Proves that files that are no checkpoint at all are refused with the file's name, by both the
// header reader (used first by eval and --resume) and the loader.
TEST(CheckpointIntegrity, TruncatedEmptyAndRandomFilesAreErrorsNamingTheFile) {
  testing::TempDir dir;
  SmallModel model;
  model.step();
  model.save(dir.file("good.pt"));
  const auto good = read_bytes(dir.file("good.pt"));
  std::string random(4096, '\0');
  const auto noise = torch::randint(0, 256, {4096}, torch::kByte);
  std::memcpy(random.data(), noise.data_ptr(), random.size());
  const std::vector<std::pair<std::string, std::string>> files{
      {"empty.pt", ""},
      {"random.pt", random},
      {"first-tenth.pt", good.substr(0, good.size() / 10)},
      {"all-but-the-last-byte.pt", good.substr(0, good.size() - 1)}};
  for (const auto& [name, bytes] : files) {
    SCOPED_TRACE(name);
    const auto path = dir.file(name);
    write_bytes(path, bytes);
    testing::expect_error([&] { read_checkpoint_header(path); }, path, "cannot be read");
    testing::expect_error([&] { load_checkpoint(path, *model.linear.ptr(), nullptr); }, path,
                          "cannot be read");
  }
}

// Proves that weights written consistently as NaN/Inf (a diverged run: the checksums match) are
// refused with the tensor's name, and load as they are when the caller allows them.
TEST(CheckpointIntegrity, NonFiniteWeightsAreRefusedUnlessAllowed) {
  testing::TempDir dir;
  SmallModel model;
  model.step();
  {
    torch::NoGradGuard no_grad;
    model.linear->bias[3] = std::numeric_limits<float>::infinity();
    model.linear->weight[2][5] = std::numeric_limits<float>::quiet_NaN();
  }
  const auto path = dir.file("diverged.pt");
  model.save(path);
  SmallModel other;
  const auto before = other.linear->weight.detach().clone();
  testing::expect_error([&] { load_checkpoint(path, *other.linear.ptr(), nullptr); }, path,
                        "1 of 256 values NaN or Inf in model tensor 'weight'");
  testing::expect_error([&] { load_checkpoint(path, *other.linear.ptr(), nullptr); }, path,
                        "--allow-non-finite");
  EXPECT_TRUE(torch::equal(other.linear->weight, before)) << "a refused load changed the model";

  load_checkpoint(path, *other.linear.ptr(), nullptr, /*allow_non_finite=*/true);
  EXPECT_TRUE(std::isnan(other.linear->weight[2][5].item<float>()));
  EXPECT_TRUE(std::isinf(other.linear->bias[3].item<float>()));
}

// Proves that a Resumption reads a run's checkpoint once (its config and position at once, its
// records then loaded from memory: the file may be gone) and loads it once.
TEST(Resumption, ReadsTheRunOnceAndLoadsItOnce) {
  testing::TempDir dir;
  SmallModel model;
  model.step();
  TrainConfig config;
  config.optimization.epochs = 30;
  TrainingPosition position;
  position.epoch = 2;
  position.step = 41;
  const auto path = dir.file("run.pt");
  save_checkpoint(path, config, position, *model.linear.ptr(), *model.optimizer);
  Resumption resumed(path);
  fs::remove(path);
  EXPECT_EQ(resumed.path(), path);
  EXPECT_EQ(resumed.config().optimization.epochs, 30);
  EXPECT_EQ(resumed.position().epoch, 2);
  EXPECT_EQ(resumed.position().step, 41);
  SmallModel other;
  other.step();
  resumed.load_into(*other.linear.ptr(), *other.optimizer, /*allow_non_finite=*/false);
  EXPECT_TRUE(torch::equal(other.linear->weight, model.linear->weight));
  EXPECT_TRUE(torch::equal(other.adamw_state_of(other.linear->weight).exp_avg(),
                           model.adamw_state_of(model.linear->weight).exp_avg()));
  testing::expect_error([&] { resumed.load_into(*other.linear.ptr(), *other.optimizer, false); }, path,
                        "its records were loaded already");
}

// Proves that NaN optimiser state is refused when the optimiser is loaded (resume), named by its
// place in the optimiser's state_dict, and ignored when only the model is (eval).
TEST(CheckpointIntegrity, NonFiniteOptimizerStateIsRefusedWhenItIsLoaded) {
  testing::TempDir dir;
  SmallModel model;
  model.step();
  model.adamw_state_of(model.linear->weight).exp_avg_sq()[0][0] = std::numeric_limits<float>::quiet_NaN();
  const auto path = dir.file("nan-state.pt");
  model.save(path);
  SmallModel other;
  other.step();
  testing::expect_error([&] { load_checkpoint(path, *other.linear.ptr(), other.optimizer.get()); },
                        path, "its optimiser state 'state[0].exp_avg_sq' holds NaN or Inf");
  EXPECT_NO_THROW(load_checkpoint(path, *other.linear.ptr(), nullptr));
  EXPECT_NO_THROW(load_checkpoint(path, *other.linear.ptr(), other.optimizer.get(), true));
  EXPECT_TRUE(std::isnan(other.adamw_state_of(other.linear->weight).exp_avg_sq()[0][0].item<float>()));
}

// A checkpoint as convnn wrote it before checksums (format 1): the optimiser's archive nested,
// no "crc32" in the header.
void save_format1_checkpoint(const std::string& path, int64_t format, SmallModel& model) {
  nlohmann::json position{{"epoch", 2},      {"next_batch", 0},  {"step", 5},
                          {"best_top1", -1.0}, {"best_epoch", -1}, {"loss_sum", 0.0},
                          {"samples", 0},    {"correct", 0},     {"seconds", 0.0}};
  nlohmann::json header{{"format", format}, {"config", TrainConfig{}}, {"position", position},
                        {"tensors", nlohmann::json::array({"weight", "bias"})}};
  torch::serialize::OutputArchive archive;
  archive.write("convnn_header", c10::IValue(header.dump()));
  archive.write("model", c10::IValue(c10::List<at::Tensor>({model.linear->weight.detach(),
                                                            model.linear->bias.detach()})));
  torch::serialize::OutputArchive optimizer_archive;
  model.optimizer->save(optimizer_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("rng_cpu", at::detail::getDefaultCPUGenerator().get_state(), /*is_buffer=*/true);
  archive.save_to(path);
}

// Proves that run folders written before the format change are refused unless trusted (opening a
// TorchScript archive can run code), resume when trusted (model, optimiser, RNG, position), and that
// a format from a newer convnn is a clear error rather than a misreading.
TEST(CheckpointIntegrity, Format1IsRefusedUnlessTrustedThenLoadsAndNewerFormatsAreRefused) {
  testing::TempDir dir;
  SmallModel model;
  model.step();
  const auto path = dir.file("format1.pt");
  save_format1_checkpoint(path, 1, model);
  const auto after_save = torch::rand({3});
  SmallModel other;
  other.step();
  for (auto* optimizer : {other.optimizer.get(), static_cast<torch::optim::Optimizer*>(nullptr)}) {
    testing::expect_error([&] { load_checkpoint(path, *other.linear.ptr(), optimizer); }, path,
                          "convnn checkpoint convert " + path + " NEW.pt --trust-legacy");
  }
  testing::expect_error([&] { read_checkpoint_header(path); }, path, "runs the code it may contain");
  testing::expect_error([&] { holds_run(path); }, path, "runs the code it may contain");
  torch::manual_seed(123);
  load_checkpoint(path, *other.linear.ptr(), other.optimizer.get(), false, LegacyFiles::Trust);
  EXPECT_TRUE(torch::equal(other.linear->weight, model.linear->weight));
  EXPECT_TRUE(torch::equal(other.adamw_state_of(other.linear->weight).exp_avg(),
                           model.adamw_state_of(model.linear->weight).exp_avg()));
  EXPECT_TRUE(torch::equal(torch::rand({3}), after_save));
  EXPECT_EQ(read_checkpoint_header(path, LegacyFiles::Trust).position.step, 5);

  const auto newer = dir.file("format3-as-archive.pt");
  save_format1_checkpoint(newer, 3, model);
  testing::expect_error([&] { read_checkpoint_header(newer, LegacyFiles::Trust); }, newer,
                        "written by a newer convnn");
}

// Runs `child` in a forked process (killed after a minute if it hangs) and returns its exit code.
int exit_code_of_child(const std::function<int()>& child) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(60);
    int code = 99;
    try {
      code = child();
    } catch (...) {
      code = 98;
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Proves that a write cut short by a full disk (here a file-size limit: write(2) fails with
// EFBIG) is an error naming the file and the cause, removes its temporary file and leaves the
// previous checkpoint in place.
TEST(CheckpointWrite, AFullDiskLeavesNoTemporaryFileAndKeepsThePreviousCheckpoint) {
  testing::TempDir dir;
  SmallModel model;
  model.step();
  const auto path = dir.file("checkpoint.pt");
  model.save(path);
  const auto saved_weight = model.linear->weight.detach().clone();
  const int code = exit_code_of_child([&] {
    const rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    ::signal(SIGXFSZ, SIG_IGN);
    model.linear->weight.detach().fill_(7.0f);
    const auto message = testing::error_of([&] { model.save(path); });
    if (message == "<no error>") return 1;
    if (files_in(dir.path()) != std::vector<std::string>{"checkpoint.pt"}) return 2;
    if (message.find(".checkpoint.pt.tmp") == std::string::npos ||
        message.find("File too large") == std::string::npos) {
      return 3;
    }
    return 0;
  });
  EXPECT_EQ(code, 0) << "1: the write did not fail; 2: a temporary file was left behind; 3: the "
                        "message lacks the file or the cause; 98: another exception; >128: a signal";
  EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"checkpoint.pt"});
  SmallModel other;
  load_checkpoint(path, *other.linear.ptr(), nullptr);
  EXPECT_TRUE(torch::equal(other.linear->weight, saved_weight)) << "the previous checkpoint was lost";
}

// Proves the sweep: temporary files of writers that no longer exist (kill -9 mid-write) are
// removed at the next checkpoint write, those of its sibling checkpoints too; those of live
// processes (a write in progress) and other files are kept.
TEST(CheckpointWrite, StaleTemporaryFilesOfDeadWritersAreSweptAndLiveOnesKept) {
  testing::TempDir dir;
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  ASSERT_EQ(::kill(dead, 0), -1) << "pid " << dead << " was reused already";
  const auto live = std::to_string(::getppid());
  const auto stale = std::to_string(dead);
  for (const std::string& name : {".checkpoint-latest.pt.tmp" + stale, ".checkpoint-best.pt.tmp" + stale,
                                  ".checkpoint-latest.pt.tmp" + live, ".notes.txt.tmp" + stale,
                                  std::string("notes.txt")}) {
    write_bytes(dir.file(name), "partial");
  }
  SmallModel model;
  model.step();
  model.save(latest_checkpoint_path(dir.path().string()));
  EXPECT_EQ(files_in(dir.path()),
            (std::vector<std::string>{".checkpoint-latest.pt.tmp" + live, ".notes.txt.tmp" + stale,
                                      "checkpoint-latest.pt", "notes.txt"}));
  write_file_atomically(dir.file("notes.txt"), "done");
  EXPECT_FALSE(fs::exists(dir.file(".notes.txt.tmp" + stale)));
  EXPECT_EQ(read_bytes(dir.file("notes.txt")), "done");
}


// A checkpoint as convnn wrote it in format 2 (a TorchScript archive with CRC-32s), before
// checkpoints became torch.save files, of `module` (its parameters, then its buffers).
void save_format2_checkpoint(const std::string& path, torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                             const TrainConfig& config = {}) {
  std::vector<at::Tensor> tensors;
  auto names = nlohmann::json::array();
  for (const auto& item : module.named_parameters()) {
    names.push_back(item.key());
    tensors.push_back(item.value().detach());
  }
  for (const auto& item : module.named_buffers()) {
    names.push_back(item.key());
    tensors.push_back(item.value().detach());
  }
  torch::serialize::OutputArchive optimizer_archive;
  optimizer.save(optimizer_archive);
  std::ostringstream optimizer_stream;
  optimizer_archive.save_to(optimizer_stream);
  const auto optimizer_text = optimizer_stream.str();
  auto optimizer_bytes = torch::empty({static_cast<int64_t>(optimizer_text.size())}, torch::kByte);
  std::memcpy(optimizer_bytes.data_ptr(), optimizer_text.data(), optimizer_text.size());
  const auto rng = at::detail::getDefaultCPUGenerator().get_state();
  const auto crc = [](const at::Tensor& t) { return detail::crc32_of(t); };
  nlohmann::json position{{"epoch", 1},        {"next_batch", 0},  {"step", 3},
                          {"best_top1", -1.0}, {"best_epoch", -1}, {"loss_sum", 0.0},
                          {"samples", 0},      {"correct", 0},     {"seconds", 0.0}};
  auto crcs = nlohmann::json::array();
  for (const auto& tensor : tensors) crcs.push_back(crc(tensor));
  nlohmann::json header{{"format", 2}, {"config", config}, {"position", position}, {"tensors", names},
                        {"crc32", {{"model", crcs}, {"optimizer", crc(optimizer_bytes)}, {"rng_cpu", crc(rng)}}}};
  const auto text = header.dump();
  torch::serialize::OutputArchive archive;
  archive.write("convnn_header", c10::IValue(text));
  archive.write("convnn_header_crc32",
                c10::IValue(static_cast<int64_t>(detail::crc32_of(text.data(), text.size()))));
  archive.write("model", c10::IValue(c10::List<at::Tensor>(tensors)));
  archive.write("optimizer_archive", optimizer_bytes, /*is_buffer=*/true);
  archive.write("rng_cpu", rng, /*is_buffer=*/true);
  archive.save_to(path);
}

// Proves that checkpoints of format 2, the last TorchScript-archive format, are refused unless
// trusted, and then still resume.
TEST(CheckpointIntegrity, Format2IsRefusedUnlessTrustedThenLoads) {
  testing::TempDir dir;
  SmallModel model;
  model.step();
  const auto path = dir.file("format2.pt");
  save_format2_checkpoint(path, *model.linear.ptr(), *model.optimizer);
  SmallModel other;
  other.step();
  testing::expect_error([&] { load_checkpoint(path, *other.linear.ptr(), other.optimizer.get()); }, path,
                        "--trust-legacy");
  load_checkpoint(path, *other.linear.ptr(), other.optimizer.get(), false, LegacyFiles::Trust);
  EXPECT_TRUE(torch::equal(other.linear->weight, model.linear->weight));
  EXPECT_TRUE(torch::equal(other.adamw_state_of(other.linear->weight).exp_avg(),
                           model.adamw_state_of(model.linear->weight).exp_avg()));
  EXPECT_EQ(read_checkpoint_header(path, LegacyFiles::Trust).position.step, 3);
}

// Proves `convnn checkpoint convert` (convert_checkpoint) rewrites a trusted format-2 checkpoint of
// a real model as plain data from which the run resumes exactly: the same weights, optimiser state,
// RNG state and position; and that it never overwrites a file.
TEST(CheckpointConvert, AFormat2RunResumesFromItsConversionExactly) {
  testing::TempDir dir;
  TrainConfig config;
  config.model = "vit_tiny";
  config.model_config.vit.depth = 1;
  config.model_config.vit.embed_dim = 32;
  config.model_config.vit.num_heads = 2;
  config.model_config.vit.patch_size = 7;
  config.model_config.num_classes = 10;
  config.model_config.in_channels = 1;
  config.model_config.image_size = 28;
  auto model = make_model(config, c10::kCPU);
  auto optimizer = make_optimizer(config.optimization, *model.module());
  for (auto& parameter : model.module()->parameters()) parameter.mutable_grad() = torch::rand_like(parameter);
  optimizer->step();
  const auto old = dir.file("format2.pt"), converted = dir.file("converted.pt");
  save_format2_checkpoint(old, *model.module(), *optimizer, config);
  const auto rng_after_save = torch::rand({4});

  convert_checkpoint(old, converted);
  EXPECT_EQ(read_checkpoint_header(converted).position.step, 3);
  auto resumed = make_model(config, c10::kCPU);
  auto resumed_optimizer = make_optimizer(config.optimization, *resumed.module());
  load_checkpoint(converted, *resumed.module(), resumed_optimizer.get());
  EXPECT_TRUE(torch::equal(torch::rand({4}), rng_after_save)) << "the RNG state was not carried over";
  const auto parameters = model.module()->parameters(), loaded = resumed.module()->parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    EXPECT_TRUE(torch::equal(parameters[i], loaded[i])) << i;
    const auto& a = dynamic_cast<torch::optim::AdamWParamState&>(
        *optimizer->state().find(parameters[i].unsafeGetTensorImpl())->second);
    const auto& b = dynamic_cast<torch::optim::AdamWParamState&>(
        *resumed_optimizer->state().find(loaded[i].unsafeGetTensorImpl())->second);
    EXPECT_TRUE(torch::equal(a.exp_avg(), b.exp_avg()) && torch::equal(a.exp_avg_sq(), b.exp_avg_sq())) << i;
    EXPECT_EQ(a.step(), b.step());
  }
  testing::expect_error([&] { convert_checkpoint(old, converted); }, converted, "exists; name a new file");
}

// Weights alone, as Python's torch.save(model.state_dict(), path) writes them (here through the
// same torch.save format, from C++): `entries` in the given order.
void save_weights_alone(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& entries) {
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [name, tensor] : entries) state.insert(name, tensor);
  write_bytes(path, torch_save_bytes(state));
}

// Proves that weights alone load by name, whatever their order, also under a DDP or
// torch.compile prefix, and that they neither resume a run nor give a header.
TEST(CheckpointWeightsAlone, LoadByNameInAnyOrderAndUnderAWrapperPrefix) {
  testing::TempDir dir;
  SmallModel model;
  const auto weight = model.linear->weight.detach() * 3, bias = model.linear->bias.detach() - 1;
  for (const std::string prefix : {"", "module.", "_orig_mod."}) {
    SCOPED_TRACE(prefix);
    const auto path = dir.file("weights" + prefix + "pt");
    save_weights_alone(path, {{prefix + "bias", bias}, {prefix + "weight", weight}});
    SmallModel other;
    EXPECT_FALSE(holds_run(path));
    load_checkpoint(path, *other.linear.ptr(), nullptr);
    EXPECT_TRUE(torch::equal(other.linear->weight, weight));
    EXPECT_TRUE(torch::equal(other.linear->bias, bias));
    other.step();
    testing::expect_error([&] { load_checkpoint(path, *other.linear.ptr(), other.optimizer.get()); }, path,
                          "holds weights only");
    testing::expect_error([&] { read_checkpoint_header(path); }, path, "--initial-checkpoint");
  }
}

// Proves that weights alone that do not fit are refused before anything changes, naming the
// file and the first tensor missing, of another shape, or extra.
TEST(CheckpointWeightsAlone, AMismatchNamesTheFirstOffendingTensor) {
  testing::TempDir dir;
  SmallModel model;
  const auto weight = model.linear->weight.detach(), bias = model.linear->bias.detach();
  const std::vector<std::tuple<std::string, std::vector<std::pair<std::string, at::Tensor>>, std::string>> cases{
      {"missing", {{"weight", weight}}, "has no 'bias' [16]"},
      {"shape", {{"weight", weight.t().narrow(0, 0, 8)}, {"bias", bias}}, "holds 'weight' Float [8, 16] where the model has 'weight' Float [16, 16]"},
      {"extra", {{"weight", weight}, {"bias", bias}, {"scale", bias}}, "holds 'scale' [16], which the model does not have"},
  };
  for (const auto& [name, entries, message] : cases) {
    SCOPED_TRACE(name);
    const auto path = dir.file(name + ".pt");
    save_weights_alone(path, entries);
    SmallModel other;
    const auto before = other.linear->weight.detach().clone();
    testing::expect_error([&] { load_checkpoint(path, *other.linear.ptr(), nullptr); }, path, message);
    EXPECT_TRUE(torch::equal(other.linear->weight, before)) << "a refused load changed the model";
  }
}

}  // namespace
}  // namespace convnn::train
