#include "convnn/train/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "checkpoint_records.h"
#include "torch_file.h"

namespace convnn::train {

namespace detail {

uint32_t crc32_of(const void* data, size_t size) {
  return static_cast<uint32_t>(::crc32_z(0, static_cast<const Bytef*>(data), size));
}

uint32_t crc32_of(const at::Tensor& tensor) {
  const auto bytes = tensor.detach().cpu().contiguous();
  return crc32_of(bytes.data_ptr(), bytes.nbytes());
}

void check_crc(const std::string& path, const std::string& record, uint32_t actual, uint32_t expected) {
  TORCH_CHECK(actual == expected, "checkpoint '", path, "' is damaged: record '", record,
              "' has CRC-32 ", actual, " but was written with ", expected,
              " (the file changed after it was written; use a copy or another checkpoint)");
}

void fail_damaged_header(const std::string& path, const std::exception& e) {
  TORCH_CHECK(false, "checkpoint '", path, "' has a damaged header: ", e.what());
}

std::shared_ptr<torch::serialize::InputArchive> optimizer_archive_from_bytes(const std::string& path,
                                                                             const at::Tensor& bytes) {
  const auto contiguous = bytes.contiguous();
  auto archive = std::make_shared<torch::serialize::InputArchive>();
  try {
    archive->load_from(static_cast<const char*>(contiguous.data_ptr()), contiguous.nbytes());
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "checkpoint '", path, "' holds an unreadable optimiser state: ", e.msg());
  }
  return archive;
}

}  // namespace detail

namespace {

namespace fs = std::filesystem;
using detail::CheckpointRecords;
using detail::check_crc;
using detail::crc32_of;
using detail::fail_damaged_header;
using detail::NamedTensors;

// Format 3 is a torch.save file, so that Python reads it with torch.load(path, weights_only=True):
// a dict of "state_dict" (the model's tensors by their names, which the Python package's models
// share), "config" and "position" (as JSON objects), and the resume records "optimizer_archive"
// (the bytes of libtorch's optimiser archive) and "rng_cpu". Beside data.pkl, the record
// convnn_header.json repeats config and position with the tensor names and the CRC-32 of every
// record (torch's zip reader does not check the archive's own CRCs), so that the header is read
// without loading the tensors; convnn_header.crc32 guards the header itself. Formats 1 and 2
// (TorchScript archives) are read by checkpoint_archive.cpp.
constexpr int64_t kFormatVersion = 3;
constexpr const char* kHeaderRecord = "convnn_header.json";
constexpr const char* kHeaderCrcRecord = "convnn_header.crc32";
constexpr int64_t kStateDictOnly = 0;  // a file of weights alone, such as Python's torch.save(model.state_dict())

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

// The model's tensors by their full names, in the order of PyTorch's state_dict (each module in
// pre-order, its parameters then its buffers), so that a checkpoint lists them as Python would.
NamedTensors named_state(torch::nn::Module& model) {
  NamedTensors state;
  for (const auto& module : model.named_modules()) {
    const auto prefix = module.key().empty() ? "" : module.key() + ".";
    for (const auto& item : module.value()->named_parameters(false)) {
      state.emplace_back(prefix + item.key(), item.value());
    }
    for (const auto& item : module.value()->named_buffers(false)) {
      state.emplace_back(prefix + item.key(), item.value());
    }
  }
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


// ---------------------------------------------------------------------------------------------
// Opening a checkpoint: which format it is, and its header.

struct OpenedCheckpoint {
  std::string path;
  nlohmann::json header;  // format, config, position, tensor names, checksums; null: a state_dict alone
};

nlohmann::json parse_header(const std::string& path, const std::string& text) {
  try {
    return nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail_damaged_header(path, e);
  }
}

nlohmann::json read_format3_header(const std::string& path, const std::string& text) {
  const auto crc_text = read_torch_file_record(path, kHeaderCrcRecord);
  TORCH_CHECK(crc_text.has_value(), "checkpoint '", path, "' is damaged: its header has no checksum");
  check_crc(path, "convnn_header", crc32_of(text.data(), text.size()),
            static_cast<uint32_t>(std::strtoul(crc_text->c_str(), nullptr, 10)));
  auto header = parse_header(path, text);
  const auto format = header.value("format", int64_t{0});
  TORCH_CHECK(format == kFormatVersion, "checkpoint '", path, "' has format ", format,
              "; this convnn reads formats 1 to ", kFormatVersion,
              format > kFormatVersion ? " (it was written by a newer convnn)" : "");
  return header;
}

OpenedCheckpoint open_checkpoint(const std::string& path) {
  TORCH_CHECK(fs::is_regular_file(path), "checkpoint '", path, "' does not exist");
  if (is_torchscript_archive(path)) return {path, detail::read_archive_header(path)};
  std::optional<std::string> text;
  try {
    text = read_torch_file_record(path, kHeaderRecord);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "checkpoint '", path, "' cannot be read (not a checkpoint or a state_dict, or damaged): ",
                e.msg());
  }
  if (!text) return {path, nullptr};
  return {path, read_format3_header(path, *text)};
}

int64_t format_of(const OpenedCheckpoint& file) {
  return file.header.is_null() ? kStateDictOnly : file.header.at("format").get<int64_t>();
}

[[noreturn]] void fail_weights_only(const std::string& path, const std::string& what) {
  TORCH_CHECK(false, "checkpoint '", path, "' holds weights only (a state_dict, as Python's "
              "torch.save(model.state_dict(), path) writes), without a run's ", what,
              ": evaluate it with the model's options (convnn eval --checkpoint FILE --model ...), or "
              "start a run from it (convnn train --initial-checkpoint FILE)");
}

// ---------------------------------------------------------------------------------------------
// Reading the records of format 3 and of a state_dict alone.

c10::IValue read_contents(const std::string& path) {
  try {
    return read_torch_file(path);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "checkpoint '", path, "' cannot be read (not a checkpoint or a state_dict, or damaged): ",
                e.msg());
  }
}

c10::IValue entry(const c10::impl::GenericDict& dict, const std::string& key) {
  const auto it = dict.find(key);
  return it == dict.end() ? c10::IValue() : it->value();
}

at::Tensor tensor_entry(const std::string& path, const c10::impl::GenericDict& dict, const std::string& key) {
  const auto value = entry(dict, key);
  TORCH_CHECK(value.isTensor(), "checkpoint '", path, "' is damaged: it holds no '", key, "' tensor");
  return value.toTensor();
}

CheckpointRecords read_format3_records(const OpenedCheckpoint& file) {
  const auto& path = file.path;
  const auto contents = read_contents(path);
  TORCH_CHECK(contents.isGenericDict(), "checkpoint '", path, "' is damaged: it does not hold a dict");
  const auto dict = contents.toGenericDict();
  const auto state = entry(dict, "state_dict");
  TORCH_CHECK(state.isGenericDict(), "checkpoint '", path, "' is damaged: it holds no state_dict");
  CheckpointRecords records;
  try {
    const auto& crc = file.header.at("crc32");
    const auto names = file.header.at("tensors").get<std::vector<std::string>>();
    const auto model_crcs = crc.at("model").get<std::vector<uint32_t>>();
    TORCH_CHECK(names.size() == model_crcs.size() && names.size() == state.toGenericDict().size(),
                "checkpoint '", path, "' is damaged: its header names ", names.size(),
                " tensors, the file holds ", state.toGenericDict().size());
    for (size_t i = 0; i < names.size(); ++i) {
      records.model.emplace_back(names[i], tensor_entry(path, state.toGenericDict(), names[i]));
      check_crc(path, names[i], crc32_of(records.model.back().second), model_crcs[i]);
    }
    const auto optimizer = tensor_entry(path, dict, "optimizer_archive");
    check_crc(path, "optimizer_archive", crc32_of(optimizer), crc.at("optimizer").get<uint32_t>());
    records.optimizer = detail::optimizer_archive_from_bytes(path, optimizer);
    records.rng = tensor_entry(path, dict, "rng_cpu");
    check_crc(path, "rng_cpu", crc32_of(records.rng), crc.at("rng_cpu").get<uint32_t>());
    TORCH_CHECK(ivalue_to_json(entry(dict, "config")) == file.header.at("config") &&
                    ivalue_to_json(entry(dict, "position")) == file.header.at("position"),
                "checkpoint '", path, "' is damaged: its config or position differ from its header's");
  } catch (const nlohmann::json::exception& e) {
    fail_damaged_header(path, e);
  }
  return records;
}

// The prefix every key has when the state_dict comes from a wrapped model: DistributedDataParallel
// ("module.") or torch.compile ("_orig_mod."); loading strips it, as timm's load_checkpoint does.
std::string wrapper_prefix(const c10::impl::GenericDict& state) {
  for (const char* prefix : {"module.", "_orig_mod."}) {
    bool all = !state.empty();
    for (const auto& item : state) all = all && item.key().toStringRef().rfind(prefix, 0) == 0;
    if (all) return prefix;
  }
  return "";
}

// Python's torch.save(model.state_dict()) or a dict holding one under "state_dict" (as timm's
// and convnn's checkpoints do).
CheckpointRecords read_state_dict_records(const std::string& path) {
  const auto contents = read_contents(path);
  auto state = contents.isGenericDict() ? entry(contents.toGenericDict(), "state_dict") : c10::IValue();
  if (!state.isGenericDict()) state = contents;
  bool tensors_by_name = state.isGenericDict();
  if (tensors_by_name) {
    for (const auto& item : state.toGenericDict()) {
      tensors_by_name = tensors_by_name && item.key().isString() && item.value().isTensor();
    }
  }
  TORCH_CHECK(tensors_by_name, "checkpoint '", path, "' holds neither a convnn checkpoint nor a state_dict "
              "(a dict of tensors by name, alone or under the key 'state_dict')");
  const auto prefix = wrapper_prefix(state.toGenericDict());
  CheckpointRecords records;
  for (const auto& item : state.toGenericDict()) {
    records.model.emplace_back(item.key().toStringRef().substr(prefix.size()), item.value().toTensor());
  }
  return records;
}

CheckpointRecords read_records(const OpenedCheckpoint& file) {
  switch (format_of(file)) {
    case kStateDictOnly: return read_state_dict_records(file.path);
    case kFormatVersion: return read_format3_records(file);
    default: return detail::read_archive_records(file.path, file.header);
  }
}

// ---------------------------------------------------------------------------------------------
// Fitting the stored tensors to a model, by name: the first missing, mismatching or extra tensor
// is the error.

std::vector<at::Tensor> fit_to_model(const std::string& path, const NamedTensors& stored,
                                     const NamedTensors& state) {
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < stored.size(); ++i) index.emplace(stored[i].first, i);
  std::vector<at::Tensor> fitted;
  for (const auto& [name, target] : state) {
    const auto it = index.find(name);
    TORCH_CHECK(it != index.end(), "checkpoint '", path, "' does not fit the model: it has no '", name,
                "' ", target.sizes(), " (it holds ", stored.size(), " tensors, the model ", state.size(),
                "): it was written for a different model");
    const auto& source = stored[it->second].second;
    TORCH_CHECK(source.sizes() == target.sizes(), "checkpoint '", path, "' does not fit the model: it holds '",
                name, "' ", source.sizes(), " where the model has '", name, "' ", target.sizes());
    fitted.push_back(source);
    index.erase(it);
  }
  for (const auto& [name, source] : stored) {
    TORCH_CHECK(index.count(name) == 0, "checkpoint '", path, "' does not fit the model: it holds '", name,
                "' ", source.sizes(), ", which the model does not have: it was written for a different model");
  }
  return fitted;
}

}  // namespace

void save_checkpoint(const std::string& path, const TrainConfig& config,
                     const TrainingPosition& position, torch::nn::Module& model,
                     torch::optim::Optimizer& optimizer) {
  auto names = nlohmann::json::array();
  auto model_crcs = nlohmann::json::array();
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [name, tensor] : named_state(model)) {
    const auto stored = tensor.detach().cpu();
    names.push_back(name);
    model_crcs.push_back(crc32_of(stored));
    state.insert(name, stored);
  }
  torch::serialize::OutputArchive optimizer_archive;
  save_optimizer_on_cpu(optimizer, optimizer_archive);
  const auto optimizer_bytes = archive_bytes(optimizer_archive);
  const auto rng = at::detail::getDefaultCPUGenerator().get_state();
  const nlohmann::json config_json = config;
  const auto position_json = position_to_json(position);
  const nlohmann::json header{
      {"format", kFormatVersion},
      {"config", config_json},
      {"position", position_json},
      {"tensors", names},
      {"crc32",
       {{"model", model_crcs}, {"optimizer", crc32_of(optimizer_bytes)}, {"rng_cpu", crc32_of(rng)}}}};
  const auto header_text = header.dump();
  c10::impl::GenericDict contents(c10::StringType::get(), c10::AnyType::get());
  contents.insert("convnn_format", kFormatVersion);
  contents.insert("state_dict", state);
  contents.insert("config", json_to_ivalue(config_json));
  contents.insert("position", json_to_ivalue(position_json));
  contents.insert("optimizer_archive", optimizer_bytes);
  contents.insert("rng_cpu", rng);
  write_file_atomically(path, torch_save_bytes(contents, {{kHeaderRecord, header_text},
                                                          {kHeaderCrcRecord, std::to_string(crc32_of(
                                                               header_text.data(), header_text.size()))}}));
  remove_stale_temporaries(fs::path(path).parent_path(), [](const std::string& name) {
    return name.size() > 3 && name.compare(name.size() - 3, 3, ".pt") == 0;
  });
}

bool holds_run(const std::string& path) { return format_of(open_checkpoint(path)) != kStateDictOnly; }

Checkpoint read_checkpoint_header(const std::string& path) {
  const auto file = open_checkpoint(path);
  if (format_of(file) == kStateDictOnly) fail_weights_only(path, "config and position");
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
  const auto file = open_checkpoint(path);
  if (optimizer != nullptr && format_of(file) == kStateDictOnly) fail_weights_only(path, "optimiser state");
  // Every record is checked, even those this call does not load: a damaged file is reported.
  const auto records = read_records(file);
  auto state = named_state(model);
  const auto fitted = fit_to_model(path, records.model, state);
  if (!allow_non_finite) {
    for (size_t i = 0; i < state.size(); ++i) {
      check_finite(path, "model tensor '" + state[i].first + "'", fitted[i]);
    }
    if (optimizer != nullptr) {
      for_each_tensor(*records.optimizer, "", [&](const std::string& key, const at::Tensor& tensor) {
        check_finite(path, "optimiser state '" + key + "'", tensor);
      });
    }
  }
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < state.size(); ++i) state[i].second.copy_(fitted[i]);
  }
  if (optimizer == nullptr) return;
  optimizer->load(*records.optimizer);
  move_state_to_parameters(*optimizer);
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(records.rng);
}

std::string latest_checkpoint_path(const std::string& run_dir) {
  return (fs::path(run_dir) / "checkpoint-latest.pt").string();
}

std::string best_checkpoint_path(const std::string& run_dir) {
  return (fs::path(run_dir) / "checkpoint-best.pt").string();
}

}  // namespace convnn::train
