#pragma once
// What the checkpoint readers of each file format hand to load_checkpoint (checkpoint.cpp): the
// header, the model tensors by name and the resume records, every checksum already checked.
#include <ATen/core/Tensor.h>
#include <torch/serialize/input-archive.h>

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace convnn::checkpoint::detail {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct CheckpointRecords {
  NamedTensors model;     // in the file's order
  c10::IValue optimizer;  // format 4: torch.optim's state_dict layout (optimizer_state.h); None: none
  // Formats 1 to 3, opened only when the caller trusts the file (LegacyFiles::Trust): libtorch's
  // optimiser archive, a TorchScript archive.
  std::shared_ptr<torch::serialize::InputArchive> optimizer_archive;
  at::Tensor rng;  // undefined: none
};

uint32_t crc32_of(const void* data, size_t size);
uint32_t crc32_of(const at::Tensor& tensor);  // over its bytes laid out contiguously on the CPU
void check_crc(const std::string& path, const std::string& record, uint32_t actual, uint32_t expected);
[[noreturn]] void fail_damaged_header(const std::string& path, const std::exception& e);

/// An optimiser archive from the bytes a checkpoint stores it as (formats 2 and 3). It runs the
/// TorchScript in the archive: only for files the caller trusts.
std::shared_ptr<torch::serialize::InputArchive> optimizer_archive_from_bytes(const std::string& path,
                                                                             const at::Tensor& bytes);

/// Checks an optimiser archive's tensors (finite unless `allow_non_finite`); the function returned
/// loads it into `optimizer`, each parameter's state onto that parameter's device.
std::function<void()> archive_optimizer_loader(torch::optim::Optimizer& optimizer,
                                               torch::serialize::InputArchive& archive,
                                               const std::string& path, bool allow_non_finite);

/// Formats 1 and 2 (TorchScript archives written by torch::serialize::OutputArchive): the header,
/// its checksum checked, and then all the records. Opening one runs the TorchScript it holds: only
/// for files the caller trusts (LegacyFiles::Trust).
nlohmann::json read_archive_header(const std::string& path);
CheckpointRecords read_archive_records(const std::string& path, const nlohmann::json& header);

}  // namespace convnn::checkpoint::detail
