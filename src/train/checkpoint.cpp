#include "convnn/train/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/List.h>
#include <fcntl.h>
#include <signal.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <system_error>
#include <type_traits>
#include <utility>

namespace convnn::train {
namespace {

namespace fs = std::filesystem;

// Format 2 added the CRC-32 checksums and stores the optimiser as the bytes of its own archive,
// so that one checksum covers all of it. Format 1 is still read, without the checksum checks.
constexpr int64_t kFormatVersion = 2;
constexpr int64_t kOldestReadableFormat = 1;

std::string errno_text(int error) { return std::system_category().message(error); }

// ---------------------------------------------------------------------------------------------
// Writing a file so that a crash, a kill or a full disk leaves either the old file or the new one.

// `.<target>.tmp<pid>` beside the target.
fs::path temporary_path(const fs::path& target, pid_t pid) {
  return target.parent_path() / ("." + target.filename().string() + ".tmp" + std::to_string(pid));
}

fs::path folder_of(const fs::path& target) {
  return target.parent_path().empty() ? fs::path(".") : target.parent_path();
}

// The target and the writer's pid of a temporary file name, if it is one.
std::optional<std::pair<std::string, pid_t>> parse_temporary_name(const std::string& name) {
  const auto tmp = name.rfind(".tmp");
  if (name.size() < 2 || name[0] != '.' || tmp == std::string::npos || tmp < 2) return std::nullopt;
  const auto digits = name.substr(tmp + 4);
  // Linux pids stay below 2^22, so nine digits are plenty and cannot overflow.
  if (digits.empty() || digits.size() > 9 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  const auto pid = static_cast<pid_t>(std::stol(digits));
  if (pid <= 0) return std::nullopt;
  return std::make_pair(name.substr(1, tmp - 1), pid);
}

// EPERM means the process exists but belongs to someone else: its write may be in progress.
bool process_exists(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

// Removes the temporary files in `folder` of the targets `ours` accepts whose writer no longer
// exists (killed mid-write). Best effort: a folder that cannot be listed is left alone, and the
// write that follows reports what is wrong with it.
void remove_stale_temporaries(const fs::path& folder,
                              const std::function<bool(const std::string& target)>& ours) {
  std::vector<fs::path> stale;
  std::error_code error;
  for (fs::directory_iterator it(folder, error), end; !error && it != end; it.increment(error)) {
    const auto parsed = parse_temporary_name(it->path().filename().string());
    if (parsed && ours(parsed->first) && parsed->second != ::getpid() &&
        !process_exists(parsed->second)) {
      stale.push_back(it->path());
    }
  }
  for (const auto& path : stale) fs::remove(path, error);
}

// A temporary file being written: closed, and removed unless renamed, when it goes out of scope,
// so that no failure leaves it behind.
class TemporaryFile {
 public:
  explicit TemporaryFile(fs::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    const int error = errno;
    TORCH_CHECK(fd_ >= 0, "cannot create '", path_.string(), "': ", errno_text(error));
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  ~TemporaryFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!renamed_) ::unlink(path_.c_str());
  }

  // write(2) may write less than asked (a signal, a full disk) and may be interrupted.
  void write_all(const std::string& contents) {
    size_t written = 0;
    while (written < contents.size()) {
      const ssize_t n = ::write(fd_, contents.data() + written, contents.size() - written);
      const int error = errno;
      if (n < 0 && error == EINTR) continue;
      TORCH_CHECK(n > 0, "writing '", path_.string(), "' failed after ", written, " of ",
                  contents.size(), " bytes: ", n < 0 ? errno_text(error) : "no progress");
      written += static_cast<size_t>(n);
    }
  }

  // On disk before the rename: otherwise a power cut can leave the renamed file empty.
  void sync_and_close() {
    int rc;
    do rc = ::fsync(fd_);
    while (rc != 0 && errno == EINTR);
    int error = errno;
    TORCH_CHECK(rc == 0, "cannot sync '", path_.string(), "' to disk: ", errno_text(error));
    rc = ::close(std::exchange(fd_, -1));  // not retried: Linux closes the descriptor even on EINTR
    error = errno;
    TORCH_CHECK(rc == 0, "writing '", path_.string(), "' failed at close: ", errno_text(error));
  }

  void rename_to(const fs::path& target) {
    const int rc = ::rename(path_.c_str(), target.c_str());
    const int error = errno;
    TORCH_CHECK(rc == 0, "cannot move '", path_.string(), "' to '", target.string(), "': ",
                errno_text(error));
    renamed_ = true;
  }

 private:
  fs::path path_;
  int fd_ = -1;
  bool renamed_ = false;
};

// Makes the rename itself durable. Some file systems cannot sync a folder (EINVAL); there the
// rename is as durable as they make it.
void sync_folder(const fs::path& folder, const fs::path& target) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int error = errno;
  TORCH_CHECK(fd >= 0, "cannot open folder '", folder.string(), "' to sync the rename of '",
              target.string(), "': ", errno_text(error));
  const int rc = ::fsync(fd);
  error = errno;
  ::close(fd);
  TORCH_CHECK(rc == 0 || error == EINVAL, "cannot sync folder '", folder.string(),
              "' after renaming '", target.string(), "': ", errno_text(error));
}

// ---------------------------------------------------------------------------------------------
// Checksums and finiteness.

uint32_t crc32_of(const void* data, size_t size) {
  return static_cast<uint32_t>(::crc32_z(0, static_cast<const Bytef*>(data), size));
}

// Over the tensor's bytes laid out contiguously on the CPU.
uint32_t crc32_of(const at::Tensor& tensor) {
  const auto bytes = tensor.detach().cpu().contiguous();
  return crc32_of(bytes.data_ptr(), bytes.nbytes());
}

void check_crc(const std::string& path, const std::string& record, uint32_t actual,
               uint32_t expected) {
  TORCH_CHECK(actual == expected, "checkpoint '", path, "' is damaged: record '", record,
              "' has CRC-32 ", actual, " but was written with ", expected,
              " (the file changed after it was written; use a copy or another checkpoint)");
}

void check_finite(const std::string& path, const std::string& what, const at::Tensor& tensor) {
  if (!tensor.is_floating_point() && !tensor.is_complex()) return;
  const auto non_finite = tensor.numel() - at::isfinite(tensor).sum().item<int64_t>();
  TORCH_CHECK(non_finite == 0, "checkpoint '", path, "' holds ", non_finite, " of ",
              tensor.numel(), " values NaN or Inf in ", what,
              " (the run that wrote it diverged, or the file was altered); allow_non_finite "
              "(convnn: --allow-non-finite) loads it anyway");
}

// Every tensor of an archive and of the archives nested in it, named by its path of keys.
void for_each_tensor(torch::serialize::InputArchive& archive, const std::string& prefix,
                     const std::function<void(const std::string&, const at::Tensor&)>& visit) {
  for (const auto& key : archive.keys()) {
    c10::IValue value;
    torch::serialize::InputArchive nested;
    if (!archive.try_read(key, value)) continue;
    if (value.isTensor()) {
      visit(prefix + key, value.toTensor());
    } else if (value.isObject() && archive.try_read(key, nested)) {
      for_each_tensor(nested, prefix + key + "/", visit);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The records of a checkpoint.

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

// The bytes of an archive as a uint8 tensor, to store one archive inside another.
at::Tensor archive_bytes(torch::serialize::OutputArchive& archive) {
  std::ostringstream stream;
  archive.save_to(stream);
  const auto bytes = stream.str();
  auto tensor = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::memcpy(tensor.data_ptr(), bytes.data(), bytes.size());
  return tensor;
}

// ---------------------------------------------------------------------------------------------
// Optimiser state between devices: checkpoints hold it on the CPU, training keeps it beside each
// parameter.

// One parameter's state with every tensor on `device`, through the state's own serialisation, so
// that any optimiser's state type moves whole and bit for bit.
std::unique_ptr<torch::optim::OptimizerParamState> state_on(
    const torch::optim::OptimizerParamState& state, const c10::Device& device) {
  torch::serialize::OutputArchive out;
  state.serialize(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  std::istringstream stream(bytes.str());
  torch::serialize::InputArchive in;
  in.load_from(stream, device);
  auto moved = state.clone();
  moved->serialize(in);
  return moved;
}

bool parameters_on_cpu(const torch::optim::Optimizer& optimizer) {
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& parameter : group.params()) {
      if (!parameter.device().is_cpu()) return false;
    }
  }
  return true;
}

// optimizer.save with its state on the CPU: a copy of the state is swapped in for the save (and
// out again, also when the save throws), so training keeps its state on the device.
void save_optimizer_on_cpu(torch::optim::Optimizer& optimizer, torch::serialize::OutputArchive& archive) {
  if (parameters_on_cpu(optimizer)) return optimizer.save(archive);  // already there: no copy
  auto& state = optimizer.state();
  std::remove_reference_t<decltype(state)> on_cpu;
  for (const auto& [key, value] : state) on_cpu.emplace(key, state_on(*value, c10::Device(c10::kCPU)));
  std::swap(state, on_cpu);
  try {
    optimizer.save(archive);
  } catch (...) {
    std::swap(state, on_cpu);
    throw;
  }
  std::swap(state, on_cpu);
}

// After optimizer.load (CPU tensors from the file): each parameter's state onto its device.
void move_state_to_parameters(torch::optim::Optimizer& optimizer) {
  auto& state = optimizer.state();
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& parameter : group.params()) {
      const auto it = state.find(parameter.unsafeGetTensorImpl());
      if (it != state.end() && !parameter.device().is_cpu()) {
        it->second = state_on(*it->second, parameter.device());
      }
    }
  }
}

struct Checksums {
  std::vector<uint32_t> model;  // in the order of the header's "tensors"
  uint32_t optimizer = 0;
  uint32_t rng = 0;
};

// A checkpoint file opened for reading, its header's checksum verified.
struct StoredCheckpoint {
  std::string path;
  torch::serialize::InputArchive archive;
  nlohmann::json header;
  std::optional<Checksums> checksums;  // none in format 1
};

[[noreturn]] void fail_damaged_header(const std::string& path, const std::exception& e) {
  TORCH_CHECK(false, "checkpoint '", path, "' has a damaged header: ", e.what());
}

torch::serialize::InputArchive open_archive(const std::string& path) {
  TORCH_CHECK(fs::is_regular_file(path), "checkpoint '", path, "' does not exist");
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path);
  } catch (const std::exception& e) {
    const auto* error = dynamic_cast<const c10::Error*>(&e);
    TORCH_CHECK(false, "checkpoint '", path, "' cannot be read (not a convnn checkpoint, or damaged): ",
                error ? error->msg() : e.what());
  }
  return archive;
}

// The header, its checksum checked before anything in it is believed.
nlohmann::json read_header(torch::serialize::InputArchive& archive, const std::string& path) {
  c10::IValue header;
  TORCH_CHECK(archive.try_read("convnn_header", header) && header.isString(),
              "checkpoint '", path, "' has no convnn header (not written by convnn train)");
  const auto& text = header.toStringRef();
  c10::IValue stored_crc;
  const bool has_crc = archive.try_read("convnn_header_crc32", stored_crc);
  if (has_crc) {
    check_crc(path, "convnn_header", crc32_of(text.data(), text.size()),
              stored_crc.isInt() ? static_cast<uint32_t>(stored_crc.toInt()) : 0);
  }
  nlohmann::json json;
  int64_t format = 0;
  try {
    json = nlohmann::json::parse(text);
    format = json.value("format", int64_t{0});
  } catch (const std::exception& e) {
    fail_damaged_header(path, e);
  }
  TORCH_CHECK(format >= kOldestReadableFormat && format <= kFormatVersion, "checkpoint '", path,
              "' has format ", format, "; this convnn reads formats ", kOldestReadableFormat, " to ",
              kFormatVersion, format > kFormatVersion ? " (it was written by a newer convnn)" : "");
  TORCH_CHECK(format == 1 || has_crc, "checkpoint '", path,
              "' is damaged: its header has no checksum, which format ", format, " requires");
  return json;
}

StoredCheckpoint open_checkpoint(const std::string& path) {
  StoredCheckpoint file{path, open_archive(path), {}, std::nullopt};
  file.header = read_header(file.archive, path);
  if (file.header.at("format") == 1) return file;
  try {
    const auto& crc = file.header.at("crc32");
    file.checksums = Checksums{crc.at("model").get<std::vector<uint32_t>>(), crc.at("optimizer"),
                               crc.at("rng_cpu")};
  } catch (const nlohmann::json::exception& e) {
    fail_damaged_header(path, e);
  }
  return file;
}

// The stored model tensors with their names, each checked against its checksum.
std::vector<std::pair<std::string, at::Tensor>> read_model_tensors(StoredCheckpoint& file) {
  const auto& path = file.path;
  c10::IValue stored;
  TORCH_CHECK(file.archive.try_read("model", stored) && stored.isTensorList(), "checkpoint '", path,
              "' holds no model tensors");
  const auto tensors = stored.toTensorList();
  std::vector<std::string> names;
  try {
    names = file.header.at("tensors").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    fail_damaged_header(path, e);
  }
  TORCH_CHECK(names.size() == tensors.size() &&
                  (!file.checksums || file.checksums->model.size() == names.size()),
              "checkpoint '", path, "' is damaged: its header names ", names.size(),
              " tensors, the file holds ", tensors.size());
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (size_t i = 0; i < names.size(); ++i) {
    named.emplace_back(names[i], tensors.get(i));
    if (file.checksums) check_crc(path, names[i], crc32_of(named.back().second), file.checksums->model[i]);
  }
  return named;
}

void check_fits_model(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& stored,
                      const std::vector<std::pair<std::string, at::Tensor>>& state) {
  TORCH_CHECK(stored.size() == state.size(), "checkpoint '", path, "' holds ", stored.size(),
              " tensors but the model has ", state.size(), ": it was written for a different model");
  for (size_t i = 0; i < state.size(); ++i) {
    const auto& [name, target] = state[i];
    const auto& [stored_name, source] = stored[i];
    TORCH_CHECK(stored_name == name && source.sizes() == target.sizes(), "checkpoint '", path,
                "' does not fit the model: it holds '", stored_name, "' ", source.sizes(),
                " where the model has '", name, "' ", target.sizes());
  }
}

// Format 1 nests the optimiser's archive; format 2 stores its bytes, under one checksum.
torch::serialize::InputArchive read_optimizer_archive(StoredCheckpoint& file) {
  torch::serialize::InputArchive archive;
  if (!file.checksums) {
    TORCH_CHECK(file.archive.try_read("optimizer", archive), "checkpoint '", file.path,
                "' holds no optimiser state");
    return archive;
  }
  at::Tensor bytes;
  TORCH_CHECK(file.archive.try_read("optimizer_archive", bytes, /*is_buffer=*/true), "checkpoint '",
              file.path, "' holds no optimiser state");
  check_crc(file.path, "optimizer_archive", crc32_of(bytes), file.checksums->optimizer);
  bytes = bytes.contiguous();
  try {
    archive.load_from(static_cast<const char*>(bytes.data_ptr()), bytes.nbytes());
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "checkpoint '", file.path, "' holds an unreadable optimiser state: ", e.msg());
  }
  return archive;
}

at::Tensor read_rng_state(StoredCheckpoint& file) {
  at::Tensor rng;
  TORCH_CHECK(file.archive.try_read("rng_cpu", rng, /*is_buffer=*/true), "checkpoint '", file.path,
              "' holds no RNG state");
  if (file.checksums) check_crc(file.path, "rng_cpu", crc32_of(rng), file.checksums->rng);
  return rng;
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& contents) {
  const fs::path target(path);
  const auto folder = folder_of(target);
  remove_stale_temporaries(folder, [&](const std::string& name) { return name == target.filename(); });
  TemporaryFile temporary(temporary_path(target, ::getpid()));
  temporary.write_all(contents);
  temporary.sync_and_close();
  temporary.rename_to(target);
  sync_folder(folder, target);
}

void save_checkpoint(const std::string& path, const TrainConfig& config,
                     const TrainingPosition& position, torch::nn::Module& model,
                     torch::optim::Optimizer& optimizer) {
  auto names = nlohmann::json::array();
  auto model_crcs = nlohmann::json::array();
  c10::List<at::Tensor> tensors;
  for (const auto& [name, tensor] : named_state(model)) {
    const auto stored = tensor.detach().cpu();
    names.push_back(name);
    model_crcs.push_back(crc32_of(stored));
    tensors.push_back(stored);
  }
  torch::serialize::OutputArchive optimizer_archive;
  save_optimizer_on_cpu(optimizer, optimizer_archive);
  const auto optimizer_bytes = archive_bytes(optimizer_archive);
  const auto rng = at::detail::getDefaultCPUGenerator().get_state();
  const nlohmann::json header{
      {"format", kFormatVersion},
      {"config", config},
      {"position", position_to_json(position)},
      {"tensors", names},
      {"crc32",
       {{"model", model_crcs}, {"optimizer", crc32_of(optimizer_bytes)}, {"rng_cpu", crc32_of(rng)}}}};
  const auto header_text = header.dump();
  torch::serialize::OutputArchive archive;
  archive.write("convnn_header", c10::IValue(header_text));
  archive.write("convnn_header_crc32",
                c10::IValue(static_cast<int64_t>(crc32_of(header_text.data(), header_text.size()))));
  archive.write("model", c10::IValue(tensors));
  archive.write("optimizer_archive", optimizer_bytes, /*is_buffer=*/true);
  archive.write("rng_cpu", rng, /*is_buffer=*/true);
  std::ostringstream bytes;
  archive.save_to(bytes);
  write_file_atomically(path, bytes.str());
  remove_stale_temporaries(folder_of(path), [](const std::string& name) {
    return name.size() > 3 && name.compare(name.size() - 3, 3, ".pt") == 0;
  });
}

Checkpoint read_checkpoint_header(const std::string& path) {
  const auto file = open_checkpoint(path);
  Checkpoint checkpoint;
  try {
    from_json(file.header.at("config"), checkpoint.config);
    checkpoint.position = position_from_json(file.header.at("position"));
  } catch (const std::exception& e) {
    fail_damaged_header(path, e);
  }
  return checkpoint;
}

void load_checkpoint(const std::string& path, torch::nn::Module& model,
                     torch::optim::Optimizer* optimizer, bool allow_non_finite) {
  auto file = open_checkpoint(path);
  // Every record is checked, even those this call does not load: a damaged file is reported.
  const auto stored = read_model_tensors(file);
  auto optimizer_archive = read_optimizer_archive(file);
  const auto rng = read_rng_state(file);
  auto state = named_state(model);
  check_fits_model(path, stored, state);
  if (!allow_non_finite) {
    for (const auto& [name, tensor] : stored) check_finite(path, "model tensor '" + name + "'", tensor);
    if (optimizer != nullptr) {
      for_each_tensor(optimizer_archive, "", [&](const std::string& key, const at::Tensor& tensor) {
        check_finite(path, "optimiser state '" + key + "'", tensor);
      });
    }
  }
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < state.size(); ++i) state[i].second.copy_(stored[i].second);
  }
  if (optimizer == nullptr) return;
  optimizer->load(optimizer_archive);
  move_state_to_parameters(*optimizer);
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(rng);
}

std::string latest_checkpoint_path(const std::string& run_dir) {
  return (fs::path(run_dir) / "checkpoint-latest.pt").string();
}

std::string best_checkpoint_path(const std::string& run_dir) {
  return (fs::path(run_dir) / "checkpoint-best.pt").string();
}

}  // namespace convnn::train
