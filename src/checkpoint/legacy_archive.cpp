// Checkpoints of formats 1 and 2: TorchScript archives written by torch::serialize::OutputArchive,
// which Python's torch.load(weights_only=True) cannot read, and format 3's optimiser record, an
// archive of the same kind. Opening a TorchScript archive runs the code in it (its modules'
// __setstate__), so this file is used only when the caller trusts the file: `convnn checkpoint
// convert --trust-legacy`, which writes it anew as plain data (format 4).
//
// Format 2 stores a CRC-32 of the header, of every model tensor, of the optimiser state (the bytes
// of its own archive) and of the RNG state. Format 1 has no checksums and nests the optimiser's
// archive.
#include <torch/serialize/output-archive.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "checkpoint/records.h"

namespace convnn::checkpoint::detail {
namespace {

struct Checksums {
  std::vector<uint32_t> model;  // in the order of the header's "tensors"
  uint32_t optimizer = 0;
  uint32_t rng = 0;
};

torch::serialize::InputArchive open_archive(const std::string& path) {
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
  TORCH_CHECK(format >= 1, "checkpoint '", path, "' has a damaged header: format ", format);
  TORCH_CHECK(format <= 2, "checkpoint '", path, "' is a TorchScript archive of format ", format,
              ", which this convnn does not read (it was written by a newer convnn)");
  TORCH_CHECK(format == 1 || has_crc, "checkpoint '", path,
              "' is damaged: its header has no checksum, which format ", format, " requires");
  return json;
}

std::optional<Checksums> checksums_of(const std::string& path, const nlohmann::json& header) {
  if (header.at("format") == 1) return std::nullopt;
  try {
    const auto& crc = header.at("crc32");
    return Checksums{crc.at("model").get<std::vector<uint32_t>>(), crc.at("optimizer").get<uint32_t>(),
                     crc.at("rng_cpu").get<uint32_t>()};
  } catch (const nlohmann::json::exception& e) {
    fail_damaged_header(path, e);
  }
}

NamedTensors read_model_tensors(torch::serialize::InputArchive& archive, const std::string& path,
                                const nlohmann::json& header, const std::optional<Checksums>& checksums) {
  c10::IValue stored;
  TORCH_CHECK(archive.try_read("model", stored) && stored.isTensorList(), "checkpoint '", path,
              "' holds no model tensors");
  const auto tensors = stored.toTensorList();
  std::vector<std::string> names;
  try {
    names = header.at("tensors").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    fail_damaged_header(path, e);
  }
  TORCH_CHECK(names.size() == tensors.size() && (!checksums || checksums->model.size() == names.size()),
              "checkpoint '", path, "' is damaged: its header names ", names.size(),
              " tensors, the file holds ", tensors.size());
  NamedTensors named;
  for (size_t i = 0; i < names.size(); ++i) {
    named.emplace_back(names[i], tensors.get(i));
    if (checksums) check_crc(path, names[i], crc32_of(named.back().second), checksums->model[i]);
  }
  return named;
}

std::shared_ptr<torch::serialize::InputArchive> read_optimizer(torch::serialize::InputArchive& archive,
                                                               const std::string& path,
                                                               const std::optional<Checksums>& checksums) {
  if (!checksums) {
    auto nested = std::make_shared<torch::serialize::InputArchive>();
    TORCH_CHECK(archive.try_read("optimizer", *nested), "checkpoint '", path, "' holds no optimiser state");
    return nested;
  }
  at::Tensor bytes;
  TORCH_CHECK(archive.try_read("optimizer_archive", bytes, /*is_buffer=*/true), "checkpoint '", path,
              "' holds no optimiser state");
  check_crc(path, "optimizer_archive", crc32_of(bytes), checksums->optimizer);
  return optimizer_archive_from_bytes(path, bytes);
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

// One parameter's state with every tensor on `device`, through the state's own serialisation, so
// that any optimiser's state type moves whole and bit for bit.
std::unique_ptr<torch::optim::OptimizerParamState> state_on(const torch::optim::OptimizerParamState& state,
                                                            const c10::Device& device) {
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

}  // namespace

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

std::function<void()> archive_optimizer_loader(torch::optim::Optimizer& optimizer,
                                               torch::serialize::InputArchive& archive,
                                               const std::string& path, bool allow_non_finite) {
  if (!allow_non_finite) {
    for_each_tensor(archive, "", [&](const std::string& key, const at::Tensor& tensor) {
      if (!tensor.is_floating_point()) return;
      TORCH_CHECK(at::isfinite(tensor).all().item<bool>(), "checkpoint '", path, "' holds NaN or Inf values in "
                  "optimiser state '", key, "' (the run that wrote it diverged, or the file was altered); "
                  "allow_non_finite (convnn: --allow-non-finite) loads it anyway");
    });
  }
  return [&optimizer, &archive] {
    optimizer.load(archive);
    move_state_to_parameters(optimizer);
  };
}

nlohmann::json read_archive_header(const std::string& path) {
  auto archive = open_archive(path);
  return read_header(archive, path);
}

CheckpointRecords read_archive_records(const std::string& path, const nlohmann::json& header) {
  auto archive = open_archive(path);
  const auto checksums = checksums_of(path, header);
  CheckpointRecords records;
  records.model = read_model_tensors(archive, path, header, checksums);
  records.optimizer_archive = read_optimizer(archive, path, checksums);
  TORCH_CHECK(archive.try_read("rng_cpu", records.rng, /*is_buffer=*/true), "checkpoint '", path,
              "' holds no RNG state");
  if (checksums) check_crc(path, "rng_cpu", crc32_of(records.rng), checksums->rng);
  return records;
}

}  // namespace convnn::checkpoint::detail
