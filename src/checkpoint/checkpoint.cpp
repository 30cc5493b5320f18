#include "convnn/checkpoint/checkpoint.h"

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

#include "checkpoint/records.h"
#include "checkpoint/optimizer_state.h"
#include "checkpoint/torch_file.h"
#include "util/json_fields.h"

namespace convnn::checkpoint {

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
  const auto* error = dynamic_cast<const c10::Error*>(&e);  // its what() holds a C++ backtrace
  TORCH_CHECK(false, "checkpoint '", path, "' has a damaged header: ", error ? error->msg() : e.what());
}

}  // namespace detail

namespace {

namespace fs = std::filesystem;
using detail::CheckpointRecords;
using detail::check_crc;
using detail::crc32_of;
using detail::fail_damaged_header;
using detail::NamedTensors;

// A CRC-32 in a header: an unsigned integer that fits 32 bits (get<uint32_t> would cut a wider one).
uint32_t crc_field(const std::string& path, const nlohmann::json& value) {
  TORCH_CHECK(value.is_number_unsigned() && value.get<uint64_t>() <= UINT32_MAX, "checkpoint '", path,
              "' has a damaged header: a CRC-32 of ", convnn::detail::shown(value), " (it must be 0 to 4294967295)");
  return value.get<uint32_t>();
}

[[noreturn]] void fail_legacy(const std::string& path, const std::string& what) {
  TORCH_CHECK(false, "checkpoint '", path, "' ", what,
              ", a TorchScript archive: opening one runs the code it may contain, so convnn does not "
              "open it by default. If you trust where the file came from, convert it once: convnn "
              "checkpoint convert ", path, " NEW.pt --trust-legacy (that opens it; the new file is plain "
              "data)");
}

// Format 4 is a torch.save file of plain data only, so that Python reads all of it with
// torch.load(path, weights_only=True): a dict of "state_dict" (the model's tensors by their names,
// which the Python package's models share), "config" and "position" (as JSON objects), and the
// resume records "optimizer" (torch.optim's state_dict layout, optimizer_state.h) and "rng_cpu".
// Beside data.pkl, the record convnn_header.json repeats config and position with the tensor names
// and the CRC-32 of every record (torch's zip reader does not check the archive's own CRCs), so
// that the header is read without loading the tensors; convnn_header.crc32 guards the header
// itself. Format 3 was the same but stored libtorch's optimiser archive (a TorchScript archive) as
// "optimizer_archive": its weights still load, its optimiser state only through a conversion that
// trusts the file. Formats 1 and 2 (TorchScript archives whole) are read only by that conversion
// (checkpoint_archive.cpp).
constexpr int64_t kFormatVersion = 4;
constexpr int64_t kArchiveOptimizerFormat = 3;
// A header is a config, a position and a name and CRC per tensor: a few hundred KB at most.
constexpr uint64_t kMaxHeaderBytes = uint64_t{16} << 20;
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
  const auto& t = p.totals;  // stored beside the other fields, as checkpoints have always held them
  return {{"epoch", p.epoch},       {"next_batch", p.next_batch}, {"step", p.step},
          {"best_top1", p.best_top1}, {"best_epoch", p.best_epoch}, {"loss_sum", t.loss_sum},
          {"samples", t.samples},   {"correct", t.correct},       {"seconds", t.seconds},
          {"skipped", t.skipped}};
}

// A position field: an integer (or, for the sums, a finite number) in its range, named when not.
int64_t position_int(const nlohmann::json& j, const char* field, int64_t low, int64_t high) {
  const auto& value = j.at(field);
  TORCH_CHECK(value.is_number_integer(), "its position's ", field, " is ", convnn::detail::shown(value),
              ", not an integer");
  const auto number = value.get<int64_t>();
  TORCH_CHECK(number >= low && number <= high, "its position's ", field, " is ", number, ", outside [", low, ", ",
              high, "]");
  return number;
}

double position_number(const nlohmann::json& j, const char* field, double low, double high) {
  const auto& value = j.at(field);
  TORCH_CHECK(value.is_number(), "its position's ", field, " is ", convnn::detail::shown(value), ", not a number");
  const auto number = value.get<double>();
  TORCH_CHECK(std::isfinite(number) && number >= low && number <= high, "its position's ", field, " is ", number,
              ", outside [", low, ", ", high, "]");
  return number;
}

// The position's own rules; those that need the run's data (the batches of an epoch) are checked
// by the trainer (check_position).
TrainingPosition position_from_json(const nlohmann::json& j) {
  constexpr int64_t kMax = int64_t{1} << 53;  // counts a float64 sum holds exactly
  TrainingPosition p;
  p.epoch = position_int(j, "epoch", 0, kMax);
  p.next_batch = position_int(j, "next_batch", 0, kMax);
  p.step = position_int(j, "step", 0, kMax);
  const auto& best = j.at("best_top1");
  p.best_top1 = best.is_number() && best.get<double>() == -1.0 ? -1.0 : position_number(j, "best_top1", 0.0, 100.0);
  p.best_epoch = position_int(j, "best_epoch", -1, p.epoch);
  auto& t = p.totals;
  t.samples = position_int(j, "samples", 0, kMax);
  t.correct = position_int(j, "correct", 0, t.samples);
  t.loss_sum = position_number(j, "loss_sum", 0.0, std::numeric_limits<double>::max());
  t.seconds = position_number(j, "seconds", 0.0, std::numeric_limits<double>::max());
  // absent from checkpoints of older versions
  t.skipped = j.contains("skipped") ? position_int(j, "skipped", 0, kMax) : 0;
  return p;
}

// ---------------------------------------------------------------------------------------------
// Opening a checkpoint: which format it is, and its header.

struct OpenedCheckpoint {
  std::string path;
  nlohmann::json header;  // format, config, position, tensor names, checksums; null: a state_dict alone
  LegacyFiles legacy = LegacyFiles::Refuse;
  // The torch.save file, held open from its header to its records; null for a TorchScript archive.
  std::shared_ptr<const TorchFile> file;
};

nlohmann::json parse_header(const std::string& path, const std::string& text) {
  return convnn::detail::parse_json(text, "checkpoint '" + path + "': its header");
}

// The header's CRC-32 as written: decimal digits of a 32-bit value, nothing else.
uint32_t stored_header_crc(const std::string& path, const std::string& text) {
  const bool digits = !text.empty() && text.size() <= 10 &&
                      text.find_first_not_of("0123456789") == std::string::npos;
  const auto value = digits ? std::stoull(text) : 0;
  TORCH_CHECK(digits && value <= UINT32_MAX, "checkpoint '", path, "' is damaged: its header's checksum '",
              text.substr(0, 40), "' is not a CRC-32 (0 to 4294967295)");
  return static_cast<uint32_t>(value);
}

nlohmann::json read_torch_file_header(const TorchFile& file, const std::string& text) {
  const auto& path = file.path();
  const auto crc_text = file.record(kHeaderCrcRecord, 16);
  TORCH_CHECK(crc_text.has_value(), "checkpoint '", path, "' is damaged: its header has no checksum");
  check_crc(path, "convnn_header", crc32_of(text.data(), text.size()), stored_header_crc(path, *crc_text));
  auto header = parse_header(path, text);
  TORCH_CHECK(header.is_object(), "checkpoint '", path, "' has a damaged header: not a JSON object");
  const auto& format = header.contains("format") ? header["format"] : nlohmann::json();
  TORCH_CHECK(format == kFormatVersion || format == kArchiveOptimizerFormat, "checkpoint '", path,
              "' has format ", convnn::detail::shown(format), "; this convnn reads formats ",
              kArchiveOptimizerFormat, " and ", kFormatVersion,
              format.is_number() && format.get<double>() > kFormatVersion ? " (it was written by a newer convnn)" : "");
  return header;
}

OpenedCheckpoint open_checkpoint(const std::string& path, LegacyFiles legacy) {
  TORCH_CHECK(fs::is_regular_file(path), "checkpoint '", path, "' does not exist");
  const auto fail_unreadable = [&path](const c10::Error& e) {
    TORCH_CHECK(false, "checkpoint '", path, "' cannot be read (not a checkpoint or a state_dict, or damaged): ",
                e.msg());
  };
  std::shared_ptr<const TorchFile> file;
  try {
    file = std::make_shared<const TorchFile>(path);
  } catch (const c10::Error& e) {
    fail_unreadable(e);
  }
  if (file->is_torchscript_archive()) {
    if (legacy == LegacyFiles::Refuse) fail_legacy(path, "is a checkpoint of format 1 or 2");
    return {path, detail::read_archive_header(path), legacy, nullptr};
  }
  std::optional<std::string> text;
  try {
    text = file->record(kHeaderRecord, kMaxHeaderBytes);
  } catch (const c10::Error& e) {
    fail_unreadable(e);
  }
  if (!text) return {path, nullptr, legacy, file};
  return {path, read_torch_file_header(*file, *text), legacy, file};
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

c10::IValue read_contents(const OpenedCheckpoint& opened) {
  const auto& path = opened.path;
  try {
    return opened.file->contents();
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

CheckpointRecords read_torch_file_records(const OpenedCheckpoint& file, bool with_optimizer) {
  const auto& path = file.path;
  const auto contents = read_contents(file);
  TORCH_CHECK(contents.isGenericDict(), "checkpoint '", path, "' is damaged: it does not hold a dict");
  const auto dict = contents.toGenericDict();
  const auto state = entry(dict, "state_dict");
  TORCH_CHECK(state.isGenericDict(), "checkpoint '", path, "' is damaged: it holds no state_dict");
  CheckpointRecords records;
  try {
    const auto& crc = file.header.at("crc32");
    const auto names = file.header.at("tensors").get<std::vector<std::string>>();
    std::vector<uint32_t> model_crcs;
    for (const auto& value : crc.at("model")) model_crcs.push_back(crc_field(path, value));
    TORCH_CHECK(names.size() == model_crcs.size() && names.size() == state.toGenericDict().size(),
                "checkpoint '", path, "' is damaged: its header names ", names.size(),
                " tensors, the file holds ", state.toGenericDict().size());
    for (size_t i = 0; i < names.size(); ++i) {
      records.model.emplace_back(names[i], tensor_entry(path, state.toGenericDict(), names[i]));
      check_crc(path, names[i], crc32_of(records.model.back().second), model_crcs[i]);
    }
    if (format_of(file) == kArchiveOptimizerFormat) {
      // Its checksum is checked; the archive itself is opened only for a conversion that trusts it.
      const auto archive = tensor_entry(path, dict, "optimizer_archive");
      check_crc(path, "optimizer_archive", crc32_of(archive), crc_field(path, crc.at("optimizer")));
      if (with_optimizer && file.legacy == LegacyFiles::Refuse) {
        fail_legacy(path, "stores its optimiser state (format 3) as libtorch's optimiser archive");
      }
      if (with_optimizer) records.optimizer_archive = detail::optimizer_archive_from_bytes(path, archive);
    } else {
      records.optimizer = entry(dict, "optimizer");
      check_crc(path, "optimizer", detail::crc32_of_value(records.optimizer), crc_field(path, crc.at("optimizer")));
    }
    records.rng = tensor_entry(path, dict, "rng_cpu");
    check_crc(path, "rng_cpu", crc32_of(records.rng), crc_field(path, crc.at("rng_cpu")));
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
CheckpointRecords read_state_dict_records(const OpenedCheckpoint& file) {
  const auto& path = file.path;
  const auto contents = read_contents(file);
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

CheckpointRecords read_records(const OpenedCheckpoint& file, bool with_optimizer) {
  switch (format_of(file)) {
    case kStateDictOnly: return read_state_dict_records(file);
    case kFormatVersion:
    case kArchiveOptimizerFormat: return read_torch_file_records(file, with_optimizer);
    default: return detail::read_archive_records(file.path, file.header);  // opened as LegacyFiles::Trust
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
    TORCH_CHECK(source.sizes() == target.sizes() && source.scalar_type() == target.scalar_type(), "checkpoint '",
                path, "' does not fit the model: it holds '", name, "' ", source.scalar_type(), " ", source.sizes(),
                " where the model has '", name, "' ", target.scalar_type(), " ", target.sizes());
    fitted.push_back(source);
    index.erase(it);
  }
  for (const auto& [name, source] : stored) {
    TORCH_CHECK(index.count(name) == 0, "checkpoint '", path, "' does not fit the model: it holds '", name,
                "' ", source.sizes(), ", which the model does not have: it was written for a different model");
  }
  return fitted;
}

// Checks the optimiser state of `records` against `optimizer` whole; the function returned loads it.
std::function<void()> optimizer_loader(torch::optim::Optimizer& optimizer, const CheckpointRecords& records,
                                       const std::string& path, bool allow_non_finite) {
  if (records.optimizer_archive) {
    return detail::archive_optimizer_loader(optimizer, *records.optimizer_archive, path, allow_non_finite);
  }
  return detail::prepare_optimizer_state(optimizer, records.optimizer, path, allow_non_finite);
}

// The rules of a position that the run's config decides; the batches of an epoch, which the data
// decides, are the trainer's to check.
void check_position(const std::string& path, const TrainingPosition& p, const TrainConfig& config) {
  const auto epochs = config.optimization.epochs;
  TORCH_CHECK(p.epoch < epochs || (p.epoch == epochs && p.next_batch == 0), "checkpoint '", path,
              "' is damaged: its position's epoch ", p.epoch, " (next batch ", p.next_batch,
              ") is past the run's ", epochs, " epochs");
  TORCH_CHECK(p.best_epoch < p.epoch || (p.best_epoch == p.epoch && p.next_batch == 0) || p.best_epoch == -1,
              "checkpoint '", path, "' is damaged: its position's best_epoch ", p.best_epoch,
              " is not before its epoch ", p.epoch);
  TORCH_CHECK((p.best_epoch == -1) == (p.best_top1 == -1.0), "checkpoint '", path,
              "' is damaged: its position's best_epoch ", p.best_epoch, " and best_top1 ", p.best_top1,
              " disagree (both are -1 before the first evaluation)");
}

// The run a checkpoint holds (its config and position, each checked by its rules); a file of
// weights alone is an error saying how such a file is used.
Checkpoint run_of(const OpenedCheckpoint& file) {
  const auto& path = file.path;
  if (format_of(file) == kStateDictOnly) fail_weights_only(path, "config and position");
  Checkpoint checkpoint;
  try {
    from_json(file.header.at("config"), checkpoint.config);
    checkpoint.position = position_from_json(file.header.at("position"));
  } catch (const std::exception& e) {
    fail_damaged_header(path, e);
  }
  try {
    validate(checkpoint.config);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "checkpoint '", path, "' holds a config that is not valid: ", e.msg());
  }
  check_position(path, checkpoint.position, checkpoint.config);
  return checkpoint;
}

// Puts checked records into the model (and the optimiser and the RNG, given an optimiser): every
// check runs before anything changes.
void load_records(const std::string& path, const detail::CheckpointRecords& records, torch::nn::Module& model,
                  torch::optim::Optimizer* optimizer, bool allow_non_finite) {
  auto state = named_state(model);
  const auto fitted = fit_to_model(path, records.model, state);
  if (!allow_non_finite) {
    for (size_t i = 0; i < state.size(); ++i) {
      check_finite(path, "model tensor '" + state[i].first + "'", fitted[i]);
    }
  }
  const auto load_optimizer = optimizer == nullptr ? std::function<void()>()
                                                   : optimizer_loader(*optimizer, records, path, allow_non_finite);
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < state.size(); ++i) state[i].second.copy_(fitted[i]);
  }
  if (optimizer == nullptr) return;
  load_optimizer();
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(records.rng);
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
  const auto optimizer_state = detail::optimizer_state_dict(optimizer);
  const auto rng = at::detail::getDefaultCPUGenerator().get_state();
  const nlohmann::json config_json = config;
  const auto position_json = position_to_json(position);
  const nlohmann::json header{
      {"format", kFormatVersion},
      {"config", config_json},
      {"position", position_json},
      {"tensors", names},
      {"crc32",
       {{"model", model_crcs}, {"optimizer", detail::crc32_of_value(optimizer_state)}, {"rng_cpu", crc32_of(rng)}}}};
  const auto header_text = header.dump();
  c10::impl::GenericDict contents(c10::StringType::get(), c10::AnyType::get());
  contents.insert("convnn_format", kFormatVersion);
  contents.insert("state_dict", state);
  contents.insert("config", json_to_ivalue(config_json));
  contents.insert("position", json_to_ivalue(position_json));
  contents.insert("optimizer", optimizer_state);
  contents.insert("rng_cpu", rng);
  write_file_atomically(path, torch_save_bytes(contents, {{kHeaderRecord, header_text},
                                                          {kHeaderCrcRecord, std::to_string(crc32_of(
                                                               header_text.data(), header_text.size()))}}));
  remove_stale_temporaries(fs::path(path).parent_path(), [](const std::string& name) {
    return name.size() > 3 && name.compare(name.size() - 3, 3, ".pt") == 0;
  });
}

bool holds_run(const std::string& path, LegacyFiles legacy) {
  return format_of(open_checkpoint(path, legacy)) != kStateDictOnly;
}

Checkpoint read_checkpoint_header(const std::string& path, LegacyFiles legacy) {
  return run_of(open_checkpoint(path, legacy));
}

void load_checkpoint(const std::string& path, torch::nn::Module& model,
                     torch::optim::Optimizer* optimizer, bool allow_non_finite, LegacyFiles legacy) {
  const auto file = open_checkpoint(path, legacy);
  if (optimizer != nullptr && format_of(file) == kStateDictOnly) fail_weights_only(path, "optimiser state");
  // Every record's checksum is checked, even for those this call does not load: a damaged file is
  // reported. The optimiser's state is interpreted only when it is loaded.
  load_records(path, read_records(file, optimizer != nullptr), model, optimizer, allow_non_finite);
}

Resumption::Resumption(const std::string& path, LegacyFiles legacy) : path_(path) {
  const auto file = open_checkpoint(path, legacy);
  run_ = run_of(file);
  records_ = std::make_shared<const detail::CheckpointRecords>(read_records(file, /*with_optimizer=*/true));
}

void Resumption::load_into(torch::nn::Module& model, torch::optim::Optimizer& optimizer, bool allow_non_finite) {
  TORCH_CHECK(records_ != nullptr, "checkpoint '", path_, "': its records were loaded already (a Resumption loads once)");
  load_records(path_, *records_, model, &optimizer, allow_non_finite);
  records_.reset();
}

CheckpointSaver::CheckpointSaver(std::string run_dir) : run_dir_(std::move(run_dir)) {}

void CheckpointSaver::stopped(const TrainConfig& config, const TrainingPosition& position, torch::nn::Module& model,
                              torch::optim::Optimizer& optimizer) const {
  save_checkpoint(latest(), config, position, model, optimizer);
}

void CheckpointSaver::epoch_done(const TrainConfig& config, const TrainingPosition& next, torch::nn::Module& model,
                                 torch::optim::Optimizer& optimizer, bool best) const {
  save_checkpoint(latest(), config, next, model, optimizer);
  if (best) save_checkpoint(this->best(), config, next, model, optimizer);
}

std::string CheckpointSaver::latest() const { return latest_checkpoint_path(run_dir_); }
std::string CheckpointSaver::best() const { return best_checkpoint_path(run_dir_); }

std::string latest_checkpoint_path(const std::string& run_dir) {
  return (fs::path(run_dir) / "checkpoint-latest.pt").string();
}

std::string best_checkpoint_path(const std::string& run_dir) {
  return (fs::path(run_dir) / "checkpoint-best.pt").string();
}

}  // namespace convnn::checkpoint
