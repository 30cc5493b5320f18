// Builds without CUDA have no NCCL backend (nccl_backend.cpp replaces this file in CUDA builds).
#include "dist/backends.h"

namespace convnn::dist {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, int64_t, int64_t,
                                                    std::chrono::milliseconds) {
  TORCH_CHECK(false, "the nccl backend needs a convnn built with CUDA (CONVNN_WITH_CUDA); use --dist-backend gloo");
}

}  // namespace convnn::dist
