// NCCL for CUDA devices, in builds with CUDA (the wheel's libtorch_cuda has ProcessGroupNCCL).
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "dist/backends.h"

namespace convnn::dist {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank,
                                                    int64_t world_size, std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(rank), static_cast<int>(world_size),
                                                     options);
}

}  // namespace convnn::dist
