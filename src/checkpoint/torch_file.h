#pragma once
// Files in the format of Python's torch.save (a zip of data.pkl and one record per storage), the
// format convnn checkpoints use so that `torch.load(path, weights_only=True)` reads them, and the
// format of the state_dicts Python users save.
//
// Only plain data crosses: dicts, lists, tuples, strings, numbers, booleans, None and dense
// tensors, the values weights_only=True accepts. Reading never runs code named in the file.
#include <ATen/core/ivalue.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace caffe2::serialize {
class PyTorchStreamReader;
}

namespace convnn::checkpoint {

/// One torch.save file held open: its zip directory is read once, then its records and its
/// contents are read from it, with the checks of the functions below (which each open the file
/// for one read). A c10::Error names the path when it is not a zip archive or is truncated.
class TorchFile {
 public:
  explicit TorchFile(const std::string& path);
  ~TorchFile();
  TorchFile(const TorchFile&) = delete;
  TorchFile& operator=(const TorchFile&) = delete;
  const std::string& path() const { return path_; }
  /// As read_torch_file_record.
  std::optional<std::string> record(const std::string& name, uint64_t max_bytes) const;
  /// As read_torch_file.
  c10::IValue contents() const;
  /// Whether it is a TorchScript archive (convnn checkpoints of formats 1 and 2).
  bool is_torchscript_archive() const;

 private:
  std::string path_;
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader_;
  uint64_t bytes_;
};

/// The bytes of a torch.save file holding `value`, whose tensors must be on the CPU. Dicts and
/// lists are written as plain Python dicts and lists, without TorchScript's type tags, which
/// weights_only=True refuses. `extra_records` (name, bytes) go beside data.pkl; torch.load
/// ignores them.
std::string torch_save_bytes(const c10::IValue& value,
                             const std::vector<std::pair<std::string, std::string>>& extra_records = {});

/// One record of a torch.save file (see torch_save_bytes), or nullopt when it has none by that
/// name; a c10::Error names `path` when it is not a zip archive, is truncated, or the record would
/// be larger than `max_bytes` (checked before it is read).
std::optional<std::string> read_torch_file_record(const std::string& path, const std::string& name,
                                                  uint64_t max_bytes);

/// Reads a torch.save file (also one saved by Python: OrderedDicts read as dicts, Parameters as
/// tensors, every tensor onto the CPU). A c10::Error names `path` when it is not a zip archive,
/// is truncated, holds a record whose size disagrees with its tensor, or holds anything but plain
/// data (which torch.load(weights_only=True) would refuse too), nests values more than 64 deep,
/// holds a reference cycle, or whose records claim more bytes than the file has.
c10::IValue read_torch_file(const std::string& path);

/// Every check read_torch_file makes, without reading the tensors' bytes (each storage record's
/// declared size is checked, its contents are not read): what the Python package runs on a file
/// before torch.load sees it (python/convnn/models.py), so that a hostile pickle is refused with
/// this reader's message instead of reaching torch.load's own unpickler. The same c10::Errors.
void check_torch_file(const std::string& path);

/// True when `path` is a TorchScript archive (what convnn checkpoints of formats 1 and 2 are)
/// rather than a torch.save file; false for anything else, including unreadable files.
bool is_torchscript_archive(const std::string& path);

/// JSON values as plain IValues (objects as dicts with string keys, arrays as lists) and back;
/// numbers keep their kind (integer or floating point), so a round trip returns the same JSON.
c10::IValue json_to_ivalue(const nlohmann::json& json);
nlohmann::json ivalue_to_json(const c10::IValue& value);

}  // namespace convnn::checkpoint
