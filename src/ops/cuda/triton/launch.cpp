#include "ops/cuda/triton/launch.h"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "ops/cuda/triton/routes.h"

namespace convnn::ops::cuda::triton {

namespace {

void check_cuda(cudaError_t status, const CompiledKernel& kernel, const char* what) {
  TORCH_CHECK(status == cudaSuccess, "convnn: ", what, " of the Triton kernel '", kernel.key, "' (", kernel.name,
              ", sm_", kernel.arch, kernel.kind == ImageKind::kPtx ? " PTX" : " cubin", ") failed: ",
              cudaGetErrorName(status), ": ", cudaGetErrorString(status));
}

// Each image is loaded once per process (a CUDA library is context-independent: one handle serves
// every device) and its dynamic shared memory allowance set once per device.
class LoadedKernels {
 public:
  cudaKernel_t get(const CompiledKernel& kernel, int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = kernels_.find(&kernel);
    if (found == kernels_.end()) {
      cudaLibrary_t library = nullptr;
      check_cuda(cudaLibraryLoadData(&library, kernel.image, nullptr, nullptr, 0, nullptr, nullptr, 0), kernel,
                 "loading");
      cudaKernel_t handle = nullptr;
      check_cuda(cudaLibraryGetKernel(&handle, library, kernel.name), kernel, "finding the entry");
      found = kernels_.emplace(&kernel, handle).first;  // the library stays loaded for the process
    }
    if (kernel.shared_bytes > kDefaultSharedBytes && configured_.emplace(&kernel, device).second) {
      check_cuda(cudaKernelSetAttributeForDevice(found->second, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 kernel.shared_bytes, device),
                 kernel, "allowing the dynamic shared memory");
    }
    return found->second;
  }

 private:
  static constexpr int kDefaultSharedBytes = 48 * 1024;  // what a launch gets without asking
  std::mutex mutex_;
  std::map<const CompiledKernel*, cudaKernel_t> kernels_;
  std::set<std::pair<const CompiledKernel*, int>> configured_;  // (kernel, device) with the allowance set
};

// The global scratch of a kernel that makes TMA descriptors on the device: global_scratch_bytes for each
// program of the grid (Triton's programs find theirs by their linear id). From the caching allocator,
// on the launch's stream: freed after the launch is queued, as any temporary, and captured by a CUDA
// graph with it; its blocks start on 512 bytes, at least the alignment any kernel here asks.
at::Tensor global_scratch(const CompiledKernel& kernel, const Grid& grid, int device) {
  if (kernel.global_scratch_bytes == 0) return {};
  constexpr int kAllocatorAlignment = 512;
  TORCH_INTERNAL_ASSERT(kernel.global_scratch_align > 0 && kAllocatorAlignment % kernel.global_scratch_align == 0,
                        "convnn: the Triton kernel '", kernel.key, "' asks for global scratch on ",
                        kernel.global_scratch_align, "-byte boundaries");
  return at::empty({grid.x * grid.y * grid.z * kernel.global_scratch_bytes},
                   at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device));
}

LoadedKernels& loaded_kernels() {
  static LoadedKernels* kernels = new LoadedKernels();  // never destroyed: launches may come late
  return *kernels;
}

}  // namespace

const CompiledKernel* kernel_for_device(const std::string& key, int device) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, int>, const CompiledKernel*> chosen;
  std::lock_guard<std::mutex> lock(mutex);
  const auto found = chosen.find({key, device});
  if (found != chosen.end()) return found->second;
  int major = 0, minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const CompiledKernel* kernel = find_compiled_kernel(key.c_str(), major, minor);
  chosen.emplace(std::make_pair(key, device), kernel);
  return kernel;
}

bool device_has_kernels(int device, const std::string& set, const std::vector<std::string>& keys) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, int>, bool> answers;
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto found = answers.find({set, device});
    if (found != answers.end()) return found->second;
  }
  bool all = true;
  for (const auto& key : keys) all = all && kernel_for_device(key, device) != nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  answers.emplace(std::make_pair(set, device), all);
  return all;
}

void launch(const char* key, const Grid& grid, KernelArguments& arguments) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  const int device = c10::cuda::current_device();
  const CompiledKernel* kernel = kernel_for_device(key, device);
  TORCH_CHECK(kernel != nullptr, "convnn: no compiled Triton kernel '", key, "' for this GPU's architecture");
  TORCH_CHECK(grid_fits(grid), "convnn: the grid (", grid.x, ", ", grid.y, ", ", grid.z, ") of the Triton kernel '",
              key, "' exceeds CUDA's limits");
  TORCH_CHECK(arguments.kinds() == kernel->parameters, "convnn: the Triton kernel '", key, "' (", kernel->name,
              ") takes parameters '", kernel->parameters, "' but its launcher passes '", arguments.kinds(), "'");
  // A tensor of another element type would be read as the compiled one's bits: a wrong answer, not an error.
  TORCH_CHECK(pointees_fit(kernel->pointees, arguments.pointees()), "convnn: the Triton kernel '", key, "' (",
              kernel->name, ") reads pointers of element types '", kernel->pointees, "' but its launcher passes '",
              arguments.pointees(), "' (f float32, h float16, b bfloat16, l int64, i int32, ? bool, - null)");
  cudaKernel_t handle = loaded_kernels().get(*kernel, device);
  const dim3 blocks(static_cast<unsigned>(grid.x), static_cast<unsigned>(grid.y), static_cast<unsigned>(grid.z));
  const dim3 threads(static_cast<unsigned>(kernel->num_warps * 32));
  const at::Tensor scratch = global_scratch(*kernel, grid, device);
  check_cuda(cudaLaunchKernel(reinterpret_cast<const void*>(handle), blocks, threads,
                              arguments.values(scratch.defined() ? scratch.const_data_ptr() : nullptr),
                              static_cast<std::size_t>(kernel->shared_bytes),
                              c10::cuda::getCurrentCUDAStream(device).stream()),
             *kernel, "launching");
}

void run_on_gpu(Launch& launch) { triton::launch(launch.key.c_str(), launch.grid, launch.arguments); }

namespace {

// This build embeds the images: the embedded route is there for the CUDA ops (routes.h).
const bool kRegistered = (register_embedded_kernels({&device_has_kernels, &run_on_gpu}), true);

}  // namespace

}  // namespace convnn::ops::cuda::triton
