// Gloo: the wheel's libtorch_cpu contains Gloo and ProcessGroupGloo, but the wheel ships no Gloo
// headers, which ProcessGroupGloo.hpp includes. Debian's libgloo-dev provides them (an older Gloo
// than the wheel's; this file uses its transport::Device only as an opaque pointer). Its
// libgloo.so must never be linked: libtorch's own Gloo would then bind to it.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>

#include "dist/backends.h"

namespace convnn::dist {

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank,
                                                    int64_t world_size, std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  // As torch.distributed: GLOO_SOCKET_IFNAME names the network interface; otherwise the address
  // this host's name resolves to (the loopback where it resolves to none).
  const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
  options->devices.push_back(interface != nullptr && *interface != '\0'
                                 ? c10d::ProcessGroupGloo::createDeviceForInterface(interface)
                                 : c10d::ProcessGroupGloo::createDefaultDevice());
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank), static_cast<int>(world_size),
                                                     options);
}

}  // namespace convnn::dist
