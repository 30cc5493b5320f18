#include "ops/cuda/triton/routes.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/List.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <mutex>

#include "convnn/version.h"

namespace convnn::ops::cuda::triton {
namespace {

std::mutex& embedded_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::optional<EmbeddedKernels>& embedded() {
  static std::optional<EmbeddedKernels> kernels;
  return kernels;
}

const c10::OperatorHandle& python_launcher() {
  static const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow("convnn::_triton_launch", "");
  return handle;
}

bool python_launcher_registered() { return python_launcher().hasKernelForDispatchKey(c10::DispatchKey::CUDA); }

}  // namespace

void register_embedded_kernels(EmbeddedKernels kernels) {
  std::lock_guard<std::mutex> lock(embedded_mutex());
  embedded() = kernels;
}

std::string load_embedded_kernels() {
#ifndef CONVNN_TRITON_KERNELS_LIBRARY
  return std::string();  // a build without them (CONVNN_TRITON_AOT): "embeds no Triton kernels"
#else
  static const std::string why_not = [] {
    Dl_info self{};
    if (dladdr(reinterpret_cast<const void*>(&register_embedded_kernels), &self) == 0 || self.dli_fname == nullptr) {
      return std::string("the folder of libconvnn_ops is unknown (dladdr failed)");
    }
    std::string folder(self.dli_fname);
    folder = folder.substr(0, folder.find_last_of('/') + 1);
    const std::string name = "libconvnn_triton_kernels.so";
    const std::string versioned = name + "." + std::to_string(CONVNN_VERSION_MAJOR) + "." +
                                  std::to_string(CONVNN_VERSION_MINOR);
    std::string error;
    for (const auto& file : {versioned, name}) {
      if (dlopen((folder + file).c_str(), RTLD_NOW | RTLD_GLOBAL) != nullptr) return std::string();
      const char* reason = dlerror();
      error = reason != nullptr ? reason : file + " did not load";
    }
    return "this library's embedded Triton kernels are not built (" + error +
           "; build the target convnn_triton_kernels, which scripts/test.sh builds)";
  }();
  return why_not;
#endif
}

std::optional<Route> route_for(const at::Tensor& t, const std::string& set, const std::vector<std::string>& keys,
                               std::string& why_not) {
  std::string not_built;
  if (t.is_cuda()) not_built = load_embedded_kernels();  // once; a no-op where they are linked
  std::optional<EmbeddedKernels> kernels;
  {
    std::lock_guard<std::mutex> lock(embedded_mutex());
    kernels = embedded();
  }
  if (kernels && t.is_cuda() && kernels->device_has(t.get_device(), set, keys)) {
    return Route{"embedded", kernels->run};
  }
  if (python_launcher_registered()) return Route{"python", &run_through_python};
  const char* launcher = " and the Python package's Triton launcher is not registered (import convnn in Python, "
                         "with triton installed)";
  why_not = std::string(!kernels && !not_built.empty() ? not_built
                        : !kernels                     ? "this library embeds no Triton kernels"
                        : !t.is_cuda() ? "the embedded Triton kernels run on CUDA tensors only"
                                       : "this GPU has no embedded image of every kernel (older than sm_80)") +
            launcher;
  return std::nullopt;
}

void run_through_python(Launch& launch) {
  const auto& arguments = launch.arguments;
  const auto& kinds = arguments.argument_kinds();
  c10::List<c10::optional<at::Tensor>> pointers;
  std::vector<int64_t> int32s;
  std::vector<double> float32s;
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    switch (kinds[i]) {
      case 'p': {
        const auto& tensor = arguments.tensor_at(i);
        pointers.push_back(tensor.defined() ? c10::optional<at::Tensor>(tensor) : c10::nullopt);
        break;
      }
      case 'i': int32s.push_back(arguments.int32_at(i)); break;
      default: float32s.push_back(arguments.float32_at(i)); break;
    }
  }
  static const auto op = python_launcher().typed<void(c10::string_view, at::IntArrayRef,
                                                       const c10::List<c10::optional<at::Tensor>>&, at::IntArrayRef,
                                                       at::ArrayRef<double>, c10::string_view)>();
  const std::vector<int64_t> grid{launch.grid.x, launch.grid.y, launch.grid.z};
  // The CUDA kernel whatever the tensors' device: under Triton's interpreter they are CPU tensors.
  op.redispatch(c10::DispatchKeySet(c10::DispatchKey::CUDA), launch.key, grid, pointers, int32s, float32s, kinds);
}

TORCH_LIBRARY_FRAGMENT(convnn, m) {
  // Implemented by the Python package (python/convnn/_triton/register.py) for the CUDA key: one
  // launch of the kernel `key` of specialisations.py on `grid`, its arguments in the order of
  // `kinds` (p: the next of `pointers`, i: of `int32s`, f: of `float32s`).
  m.def("_triton_launch(str key, int[] grid, Tensor?[] pointers, int[] int32s, float[] float32s, str kinds) -> ()");
}

}  // namespace convnn::ops::cuda::triton
