// The restricted torch.save reader's checks as dispatcher ops, for the Python package
// (python/convnn/models.py, load_checkpoint), which runs them before torch.load sees a file:
//
//   convnn::check_torch_file(str path) -> ()         read_torch_file's checks without the tensors'
//                                                    bytes (a c10::Error, a RuntimeError in Python,
//                                                    names the file and the rule it breaks)
//   convnn::is_torchscript_archive(str path) -> bool a TorchScript archive (convnn checkpoints of
//                                                    formats 1 and 2), which is never unpickled
#include <torch/library.h>

#include <string>

#include "checkpoint/torch_file.h"

namespace convnn::checkpoint {
namespace {

void check_torch_file_op(c10::string_view path) { check_torch_file(std::string(path)); }

bool is_torchscript_archive_op(c10::string_view path) { return is_torchscript_archive(std::string(path)); }

TORCH_LIBRARY_FRAGMENT(convnn, m) {
  m.def("check_torch_file(str path) -> ()", &check_torch_file_op);
  m.def("is_torchscript_archive(str path) -> bool", &is_torchscript_archive_op);
}

}  // namespace
}  // namespace convnn::checkpoint
