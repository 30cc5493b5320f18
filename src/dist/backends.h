#pragma once
// The c10d backends a process group can use, one file each: Gloo (gloo_backend.cpp, every build)
// and NCCL (nccl_backend.cpp in builds with CUDA; otherwise a clear error).
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>

namespace convnn::dist {

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank,
                                                    int64_t world_size, std::chrono::milliseconds timeout);
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank,
                                                    int64_t world_size, std::chrono::milliseconds timeout);

}  // namespace convnn::dist
