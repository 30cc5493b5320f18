// The Triton kernels compiled ahead of time into libconvnn_triton_kernels (src/ops/cuda/triton/),
// proved without a GPU: the embedded images are complete for every architecture, the image chosen
// for a GPU follows its compute capability, and every launch the C++ host code makes (run here on
// CPU tensors, with a runner that records instead of launching) passes exactly the parameters the
// compiled kernel declares, its pointers to tensors of the element types it was compiled for, on
// grids within CUDA's limits. On a machine with a GPU the kernels run
// against the generic path as well.
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "support/build_features.h"

#if CONVNN_BUILD_TRITON_AOT
#include "convnn/ops/knn_ops.h"
#include "ops/cuda/triton/aggregate_launches.h"
#include "ops/cuda/triton/attention_launches.h"
#include "ops/cuda/triton/compiled_kernels.h"
#include "ops/cuda/triton/first_call_check.h"
#include "ops/cuda/triton/launch.h"
#include "ops/cuda/triton/routes.h"
#include "ops/cuda/triton/select_launches.h"
#include "ops/generic/generic.h"

namespace triton_aot_test {  // apart from the files of its unity batch (tests/CMakeLists.txt)

namespace triton = convnn::ops::cuda::triton;

namespace {

// Every key in the table, once.
std::vector<std::string> every_key() {
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < triton::kCompiledKernelCount; ++i) {
    const std::string key = triton::kCompiledKernels[i].key;
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  }
  return keys;
}

const triton::CompiledKernel* entry(const std::string& key, int arch, triton::ImageKind kind) {
  for (std::size_t i = 0; i < triton::kCompiledKernelCount; ++i) {
    const auto& e = triton::kCompiledKernels[i];
    if (key == e.key && e.arch == arch && e.kind == kind) return &e;
  }
  return nullptr;
}

}  // namespace

TEST(TritonAot, EveryKernelHasACubinForSm80AndSm90AndAnSm80Ptx) {
  const auto keys = every_key();
  // 30 aggregation specialisations, 72 x 3 of knn_select (6 similarities x 4 widths x 3 mask kinds,
  // per input dtype), 12 of its backward (3 kernels x 4 similarities), 72 x 3 of the fused
  // knn_attention (as knn_select), 4 x 3 of its composed forward's rho and aggregation (one per width
  // and input dtype), 4 x 3 of its backward's softmax scores gradient (one per width and dtype), 9 x 3 of its two-kernel backward (the row kernel for dot and scaled_dot at each width,
  // the column kernel; per dtype), knn_select on tensor cores and its rerun (dot, scaled_dot, cosine and
  // gaussian x the 2 widths up to its max_slots x 3 mask kinds per half-precision dtype, and for float32
  // inputs no mask and a bool mask at both widths and an additive mask at the narrower: 68 each), the
  // first of its two launches with a bool mask (its whole tiles: 4 similarities x 2 widths x 3 input
  // dtypes), its rows' seeds kernel (dot and scaled_dot x no mask and a bool mask, one for every width,
  // per input dtype), its keys' norms kernel per input dtype and its bool masks' bits kernel.
  EXPECT_EQ(keys.size(), 30u + 72u * 3u + 12u + 72u * 3u + 4u * 3u + 4u * 3u + 9u * 3u +
                             2u * (4u * (2u * 3u * 2u + 2u + 2u + 1u)) + 4u * 2u * 3u + 2u * 2u * 3u + 3u + 1u);
  for (const auto& key : keys) {
    for (const int arch : {80, 90}) {
      const auto* cubin = entry(key, arch, triton::ImageKind::kCubin);
      ASSERT_NE(cubin, nullptr) << key << " sm_" << arch;
      ASSERT_GT(cubin->image_bytes, 4u);
      EXPECT_EQ(std::string(cubin->image, 4), "\x7f" "ELF") << key << " sm_" << arch;
      const bool rho_aggregate = key.rfind("attention rho aggregate ", 0) == 0;
      const bool running_top_k = (key.rfind("select ", 0) == 0 || key.rfind("attention ", 0) == 0 ||
                                  key.rfind("rerun select ", 0) == 0) &&
                                 key.find("backward") == std::string::npos &&
                                 key.find("gradient") == std::string::npos && !rho_aggregate;
      const bool tensor_cores = key.rfind("bounded select ", 0) == 0;
      const bool half_inputs = key.find(" inputs") != std::string::npos;  // float32 kernels' keys name no dtype
      const bool additive_mask = key.find(" additive mask") != std::string::npos;
      const bool bool_mask = key.find(" bool mask") != std::string::npos;
      const bool two_kernel_backward = key.rfind("attention backward ", 0) == 0;
      const bool seeds = key.rfind("bounded seeds ", 0) == 0;  // bounded_select.seed_warps
      // The composed forward's rho and aggregation takes a warp per 8 slots (attention.rho_aggregate_
      // options). A running top-K held a query row per thread (K <= thread_slots) and the two-kernel
      // backward are one lane per row of the program (top_k_rows, row_rows, column_rows), but for the row
      // kernel at the widest running top-K (two lanes per row: attention_backward.compile_options);
      // the shared set takes 8 warps, and so does the tensor-core select but for half-precision inputs
      // without a mask, or with a bool one up to K = 8 (a warpgroup: bounded_select.compile_options), and
      // its seeds kernel but for half-precision inputs (a warpgroup).
      const auto at_width = key.find("K<=");
      const auto width = at_width == std::string::npos ? int64_t{0} : std::stoll(key.substr(at_width + 3));
      const bool widest_rows = two_kernel_backward && width == triton::kSelectBlocks.max_slots;
      const int64_t warps = rho_aggregate ? std::max<int64_t>(1, width / 8)
                            : running_top_k && width <= triton::kSelectBlocks.thread_slots
                                ? triton::kSelectBlocks.thread_rows / 32
                            : tensor_cores ? (half_inputs && !additive_mask && !(bool_mask && width > 8) ? 4 : 8)
                            : seeds        ? (half_inputs ? 4 : 8)
                            : running_top_k ? 8
                            : widest_rows         ? 2 * triton::kAttentionBackwardBlocks.row_rows / 32
                            : two_kernel_backward ? triton::kAttentionBackwardBlocks.row_rows / 32
                                                  : 4;
      EXPECT_EQ(cubin->num_warps, warps) << key;
      // Within the architecture's most a block can opt in to (launch.cpp raises the allowance above the
      // default 48 KB: the seeds kernel's pipelined copies of float32 tiles take 48-65 KB).
      EXPECT_LE(cubin->shared_bytes, (arch == 80 ? 163 : 227) * 1024) << key << " sm_" << arch;
      // Global scratch (on-device TMA descriptors, sm_90 alone: Triton lowers them to loads on sm_80) is the
      // seeds kernel's and the two-tile step's: the tensor-core select of dot and scaled_dot in half
      // precision without an additive mask (bounded_select.tiles_per_step), on boundaries the launch's
      // allocation keeps (launch.cpp: 512 bytes).
      const bool dot_products = key.find(" dot K<=") != std::string::npos ||
                                key.find(" scaled_dot K<=") != std::string::npos;
      const bool two_tile_step = tensor_cores && half_inputs && dot_products && !additive_mask &&
                                 (!bool_mask || key.rfind("bounded select whole tiles ", 0) == 0);
      EXPECT_EQ(cubin->global_scratch_bytes > 0, arch == 90 && (two_tile_step || seeds)) << key << " sm_" << arch;
      EXPECT_EQ(512 % std::max(cubin->global_scratch_align, 1), 0) << key << " sm_" << arch;
      // Triton's two scratch pointers close every parameter list.
      const std::string parameters = cubin->parameters;
      EXPECT_EQ(parameters.substr(parameters.size() - 2), "pp") << key;
    }
    const auto* ptx = entry(key, 80, triton::ImageKind::kPtx);
    ASSERT_NE(ptx, nullptr) << key;
    const std::string text(ptx->image, ptx->image_bytes);
    EXPECT_EQ(ptx->image[ptx->image_bytes], '\0') << "the driver reads PTX up to its terminating zero";
    EXPECT_NE(text.find(std::string(".entry ") + ptx->name), std::string::npos) << key;
    EXPECT_NE(text.find(".target sm_80"), std::string::npos) << key;
  }
}

// libconvnn_ops loads the kernels' library by its file name from its own folder on the first CUDA
// call: the name and folder it computes must be the ones the build gives the library (this test
// binary links it, so the load finds it loaded; a wrong name or folder fails with dlopen's reason).
TEST(TritonAot, ALaunchFitsOnlyTensorsOfTheElementTypesTheKernelWasCompiledFor) {
  EXPECT_EQ(triton::pointee_letter(torch::kInt), 'i');
  EXPECT_EQ(triton::pointee_letter(torch::kLong), 'l');
  EXPECT_EQ(triton::pointee_letter(torch::kDouble), '!');
  EXPECT_TRUE(triton::pointees_fit("fil", "fil"));
  EXPECT_TRUE(triton::pointees_fit("fil", "f-l")) << "a null pointer the kernel does not read";
  EXPECT_FALSE(triton::pointees_fit("fil", "fll")) << "int64 positions where the kernel reads int32 ones";
  EXPECT_FALSE(triton::pointees_fit("fil", "fi"));
  EXPECT_TRUE(triton::pointees_fit("b*l", "bhl")) << "an output in the op's dtype";
  EXPECT_FALSE(triton::pointees_fit("b*l", "bil"));
  triton::KernelArguments arguments;
  arguments.pointer(torch::zeros({2}, torch::kBFloat16)).int32(3).pointer(torch::Tensor()).pointer(
      torch::zeros({2}, torch::kBool));
  EXPECT_EQ(arguments.pointees(), "b-?");
  // Every compiled kernel declares a type for each of its pointers but Triton's two scratch ones.
  for (std::size_t i = 0; i < triton::kCompiledKernelCount; ++i) {
    const auto& compiled = triton::kCompiledKernels[i];
    const std::string parameters = compiled.parameters;
    EXPECT_EQ(std::string(compiled.pointees).size() + 2, static_cast<std::size_t>(std::count(
        parameters.begin(), parameters.end(), 'p'))) << compiled.key;
  }
}

TEST(TritonAot, TheOpsLibraryFindsTheKernelsLibraryBesideItself) {
  EXPECT_EQ(triton::load_embedded_kernels(), "");
}

TEST(TritonAot, TheImageForAGpuFollowsItsComputeCapability) {
  const char* key = "forward float32";
  const auto expect = [&](int major, int minor, int arch, triton::ImageKind kind) {
    const auto* chosen = triton::find_compiled_kernel(key, major, minor);
    ASSERT_NE(chosen, nullptr) << major << "." << minor;
    EXPECT_EQ(chosen->arch, arch) << major << "." << minor;
    EXPECT_EQ(chosen->kind, kind) << major << "." << minor;
  };
  expect(8, 0, 80, triton::ImageKind::kCubin);   // A100
  expect(8, 6, 80, triton::ImageKind::kCubin);   // an sm_80 cubin runs on every 8.x
  expect(8, 9, 80, triton::ImageKind::kCubin);   // L4, L40
  expect(9, 0, 90, triton::ImageKind::kCubin);   // H100, H200: the sm_90a cubin
  expect(10, 0, 80, triton::ImageKind::kPtx);    // B200: no cubin of its major, the driver compiles PTX
  expect(12, 0, 80, triton::ImageKind::kPtx);
  EXPECT_EQ(triton::find_compiled_kernel(key, 7, 5), nullptr) << "no image runs below sm_80";
  EXPECT_EQ(triton::find_compiled_kernel("no such kernel", 9, 0), nullptr);
}

namespace {

struct Recorded {
  std::string key;
  triton::Grid grid;
  std::string kinds;
};

// Runs the host code with a runner that records each launch and checks it against the compiled
// kernel's declaration for both architectures.
struct Recorder {
  std::vector<Recorded> launches;
  triton::LaunchRunner runner() {
    return [this](triton::Launch& launch) {
      launches.push_back({launch.key, launch.grid, launch.arguments.kinds()});
      for (const int arch : {80, 90}) {
        const auto* compiled = entry(launch.key, arch, triton::ImageKind::kCubin);
        ASSERT_NE(compiled, nullptr) << launch.key;
        EXPECT_EQ(launch.arguments.kinds(), compiled->parameters) << launch.key << " sm_" << arch;
        EXPECT_TRUE(triton::pointees_fit(compiled->pointees, launch.arguments.pointees()))
            << launch.key << " sm_" << arch << ": compiled for pointers to '" << compiled->pointees << "', passed '"
            << launch.arguments.pointees() << "'";
      }
      EXPECT_TRUE(triton::grid_fits(launch.grid)) << launch.key;
    };
  }
};

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

TEST(TritonAot, EveryLaunchPassesTheParametersTheCompiledKernelDeclares) {
  const int64_t g = 3, n = 70, m = 41, c = 37, k = 5, c_out = 45;
  const int64_t rows = triton::kAggregateBlocks.rows, channels = triton::kAggregateBlocks.channels;
  for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    const auto options = torch::TensorOptions().dtype(dtype);
    const auto values = torch::randn({g, m, c}, options), weights = torch::randn({g, n, k}, options);
    const auto indices = torch::randint(0, m, {g, n, k}, torch::kLong);
    for (const bool standard : {false, true}) {
      const auto kernel = standard ? torch::randn({c_out, c, k}, options) : torch::randn({c, k}, options);
      const int64_t out = kernel.size(0);
      for (const bool with_bias : {false, true}) {
        Recorder recorder;
        const auto bias = with_bias ? torch::randn({out}, options) : torch::Tensor();
        const auto output = triton::aggregate_forward(values, weights, indices, kernel, bias, recorder.runner());
        EXPECT_EQ(output.sizes(), (std::vector<int64_t>{g, n, out}));
        ASSERT_EQ(recorder.launches.size(), 1u);
        EXPECT_EQ(recorder.launches[0].grid.x, cdiv(g * n, rows));
        EXPECT_EQ(recorder.launches[0].grid.y, cdiv(out, channels));
      }
      Recorder recorder;
      const auto grad_output = torch::randn({g, n, out}, options);
      const auto [gv, gw, gk, gb] = triton::aggregate_backward(grad_output, values, weights, indices, kernel,
                                                               {true, true, true, true}, recorder.runner());
      ASSERT_EQ(recorder.launches.size(), 3u);
      EXPECT_EQ(recorder.launches[0].key.find("d values"), standard ? 9u : 0u);
      EXPECT_EQ(recorder.launches[0].grid.x, g * m) << "one program per values row";
      EXPECT_EQ(recorder.launches[1].grid.y, k) << "one program per slot";
      EXPECT_EQ(gv.sizes(), values.sizes());
      EXPECT_EQ(gw.sizes(), weights.sizes());
      EXPECT_EQ(gk.sizes(), kernel.sizes());
      EXPECT_EQ(gk.scalar_type(), dtype) << "the float32 partial sums come back in the kernel's dtype";
      EXPECT_TRUE(torch::equal(gb, grad_output.sum(std::vector<int64_t>{0, 1})));
    }
  }
}

TEST(TritonAot, BackwardLaunchesOnlyWhatTheOutputMaskAsksFor) {
  const auto values = torch::randn({2, 9, 5}), weights = torch::randn({2, 7, 3});
  const auto indices = torch::randint(0, 9, {2, 7, 3}, torch::kLong);
  Recorder recorder;
  const auto [gv, gw, gk, gb] = triton::aggregate_backward(torch::randn({2, 7, 5}), values, weights, indices,
                                                           torch::randn({5, 3}), {false, true, false, false},
                                                           recorder.runner());
  ASSERT_EQ(recorder.launches.size(), 1u);
  EXPECT_EQ(recorder.launches[0].key, "d weights float32");
  EXPECT_FALSE(gv.defined());
  EXPECT_TRUE(gw.defined());
  EXPECT_FALSE(gk.defined());
  EXPECT_FALSE(gb.defined());
}

TEST(TritonAot, EmptyInputsLaunchNothingAndReturnTheBiasOrZeros) {
  Recorder recorder;
  const auto values = torch::randn({2, 9, 0}), weights = torch::randn({2, 7, 3});
  const auto indices = torch::randint(0, 9, {2, 7, 3}, torch::kLong);
  const auto standard_kernel = torch::randn({4, 0, 3}), bias = torch::randn({4});
  const auto output = triton::aggregate_forward(values, weights, indices, standard_kernel, bias, recorder.runner());
  EXPECT_TRUE(recorder.launches.empty());
  EXPECT_TRUE(torch::equal(output, bias.expand({2, 7, 4})));
}

TEST(TritonAot, InverseIndexListsEachValuesRowsSlotsInSlotOrder) {
  const int64_t g = 3, n = 11, m = 6, k = 4;
  const auto indices = torch::randint(0, m, {g, n, k}, torch::kLong);
  const auto [order, run_start] = triton::inverse_index(indices, m);
  // The kernels read both through int32 pointers.
  EXPECT_EQ(order.scalar_type(), torch::kInt);
  EXPECT_EQ(run_start.scalar_type(), torch::kInt);
  ASSERT_EQ(run_start.numel(), g * m + 1);
  EXPECT_EQ(run_start[0].item<int64_t>(), 0);
  EXPECT_EQ(run_start[g * m].item<int64_t>(), g * n * k);
  const auto flat = indices.reshape(-1);
  for (int64_t row = 0; row < g * m; ++row) {
    std::vector<int64_t> expected;  // the slots reading `row`, ascending
    for (int64_t slot = 0; slot < g * n * k; ++slot) {
      const int64_t slice = slot / (n * k);
      if (slice * m + flat[slot].item<int64_t>() == row) expected.push_back(slot);
    }
    std::vector<int64_t> got;
    for (int64_t p = run_start[row].item<int64_t>(); p < run_start[row + 1].item<int64_t>(); ++p) {
      got.push_back(order[p].item<int32_t>());
    }
    EXPECT_EQ(got, expected) << "values row " << row;
  }
}

const std::vector<convnn::Similarity> kSimilarities{
    convnn::Similarity::Dot,      convnn::Similarity::ScaledDot, convnn::Similarity::Cosine,
    convnn::Similarity::Gaussian, convnn::Similarity::Chebyshev, convnn::Similarity::L1};

TEST(TritonAot, RunningTopKProgramsTakeARowPerLaneUpToThreadSlotsAndSixteenRowsAbove) {
  // select.py's rule, read through the generated constants: the set held per thread takes one warp
  // of thread_rows rows; wider sets, 16 rows shared by 8 warps.
  EXPECT_EQ(triton::kSelectBlocks.thread_rows % 32, 0);
  for (int64_t k = 1; k <= triton::kSelectBlocks.max_slots; ++k) {
    const bool per_thread = triton::top_k_slots(k) <= triton::kSelectBlocks.thread_slots;
    EXPECT_EQ(triton::top_k_rows(k), per_thread ? triton::kSelectBlocks.thread_rows : triton::kSelectBlocks.rows) << k;
  }
  EXPECT_EQ(triton::top_k_rows(triton::kSelectBlocks.max_slots), triton::kSelectBlocks.rows);
}

TEST(TritonAot, EverySelectLaunchPassesTheParametersTheCompiledKernelDeclares) {
  const int64_t g = 3, n = 21, m = 70, d = 5;
  for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    const auto queries = torch::randn({g, n, d}).to(dtype), keys = torch::randn({g, m, d}).to(dtype);
    const std::vector<torch::Tensor> masks{torch::Tensor(), torch::rand({n, m}) > 0.3,
                                           torch::zeros({g, n, m}).to(dtype)};
    for (const auto similarity : kSimilarities) {
      for (const auto& mask : masks) {
        for (const int64_t k : {1, 9, 64}) {
          Recorder recorder;
          const auto [scores, indices] =
              triton::select_forward(queries, keys, k, similarity, mask, /*index_order=*/k == 9, recorder.runner());
          ASSERT_EQ(recorder.launches.size(), 1u);
          EXPECT_EQ(recorder.launches[0].grid.x, cdiv(n, triton::top_k_rows(k)));
          EXPECT_EQ(recorder.launches[0].grid.y, g) << "one program column per slice";
          EXPECT_EQ(scores.scalar_type(), dtype);
          EXPECT_EQ(indices.sizes(), (std::vector<int64_t>{g, n, k}));
        }
      }
      Recorder recorder;
      const auto [scores, indices] = convnn::ops::generic::knn_select(queries, keys, 6, convnn::to_string(similarity),
                                                                      c10::nullopt, false);
      const auto [gq, gk] = triton::select_backward(torch::randn(scores.sizes()).to(dtype), queries, keys, indices,
                                                    scores, similarity, recorder.runner());
      const bool dot_product = similarity == convnn::Similarity::Dot || similarity == convnn::Similarity::ScaledDot;
      // Dot products: the aggregation's forward and its values' gradient; the others: the
      // coefficients, the query gradient, the key gradient.
      ASSERT_EQ(recorder.launches.size(), dot_product ? 2u : 3u);
      EXPECT_EQ(gq.sizes(), queries.sizes());
      EXPECT_EQ(gk.sizes(), keys.sizes());
      EXPECT_EQ(gq.scalar_type(), dtype);
    }
  }
}

TEST(TritonAot, EveryTensorCoreSelectLaunchPassesTheParametersTheCompiledKernelsDeclare) {
  // knn_select on tensor cores (issue 41), each similarity it serves: the keys' norms, the tensor-core
  // kernel on a persistent grid (after a bool mask's words and the rows' seeds), then the IEEE
  // kernel's rerun of the rows it leaves, over the same outputs; where no tensor-core kernel was
  // compiled (K above its max_slots, float32 inputs with an additive mask above float32_mask_slots)
  // or the rows are not whole chunks of its features (D = 5), the IEEE kernel alone.
  const int64_t g = 3, n = 45, m = 70;
  for (const int64_t d : {triton::kBoundedSelectBlocks.features, int64_t{5}}) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
      const auto queries = torch::randn({g, n, d}).to(dtype), keys = torch::randn({g, m, d}).to(dtype);
      const std::vector<torch::Tensor> masks{torch::Tensor(), torch::rand({n, m}) > 0.3,
                                             torch::zeros({g, n, m}).to(dtype)};
      for (const auto similarity : {convnn::Similarity::Dot, convnn::Similarity::ScaledDot, convnn::Similarity::Cosine,
                                    convnn::Similarity::Gaussian}) {
        for (const auto& mask : masks) {
          for (const int64_t k : {1, 9, 16, 64}) {
            Recorder recorder;
            const auto [scores, indices] = triton::select_forward(queries, keys, k, similarity, mask, k == 9,
                                                                  recorder.runner(), triton::SelectScores::TensorCores);
            const bool served = d % triton::kBoundedSelectBlocks.features == 0 &&
                                k <= triton::kBoundedSelectBlocks.max_slots &&
                                (dtype != torch::kFloat || !mask.defined() || mask.scalar_type() == torch::kBool ||
                                 triton::top_k_slots(k) <= triton::kBoundedSelectBlocks.float32_mask_slots);
            EXPECT_EQ(scores.scalar_type(), dtype);
            EXPECT_EQ(indices.sizes(), (std::vector<int64_t>{g, n, k}));
            if (!served) {
              ASSERT_EQ(recorder.launches.size(), 1u);
              EXPECT_EQ(recorder.launches[0].key.rfind("select ", 0), 0u) << recorder.launches[0].key;
              continue;
            }
            // A bool mask's words before the tensor-core kernel (the shared [N,M] mask's N rows), and for
            // dot and scaled_dot without an additive mask the rows' seeds (bounded_select._tile_bound);
            // with a bool mask, the kernel's whole tiles first, in a launch of their own.
            const size_t words = mask.defined() && mask.scalar_type() == torch::kBool ? 1 : 0;
            const bool dot_products =
                similarity == convnn::Similarity::Dot || similarity == convnn::Similarity::ScaledDot;
            const size_t seeds = dot_products && (!mask.defined() || words != 0) ? 1 : 0;
            ASSERT_EQ(recorder.launches.size(), 3u + 2u * words + seeds) << d << " " << k;
            EXPECT_EQ(recorder.launches[0].key.rfind("key norms", 0), 0u) << recorder.launches[0].key;
            if (words != 0) {
              EXPECT_EQ(recorder.launches[1].key, "mask bits");
              EXPECT_EQ(recorder.launches[1].grid.x, cdiv(n, triton::kBoundedSelectBlocks.mask_bits_rows));
              EXPECT_EQ(recorder.launches[1].grid.y, cdiv(m, triton::kBoundedSelectBlocks.candidates));
            }
            if (seeds != 0) {
              const auto& seeding = recorder.launches[1 + words];
              EXPECT_EQ(seeding.key.rfind("bounded seeds ", 0), 0u) << seeding.key;
              EXPECT_EQ(seeding.key.find("K<="), std::string::npos) << "one kernel for every width: " << seeding.key;
              EXPECT_EQ(seeding.grid.x, cdiv(n, triton::kBoundedSelectBlocks.rows));
              EXPECT_EQ(seeding.grid.y, g);
            }
            if (words != 0) {
              const auto& whole_tiles = recorder.launches[1 + words + seeds];
              EXPECT_EQ(whole_tiles.key.rfind("bounded select whole tiles ", 0), 0u) << whole_tiles.key;
              EXPECT_EQ(whole_tiles.grid.x, cdiv(n, triton::kBoundedSelectBlocks.rows) * g);
            }
            const auto& bounded = recorder.launches[1 + 2 * words + seeds];
            const auto& rerun = recorder.launches[2 + 2 * words + seeds];
            EXPECT_EQ(bounded.key.rfind("bounded select ", 0), 0u) << bounded.key;
            EXPECT_EQ(bounded.key.find("whole tiles"), std::string::npos) << bounded.key;
            EXPECT_EQ(rerun.key.rfind("rerun select ", 0), 0u) << rerun.key;
            EXPECT_EQ(recorder.launches[0].grid.x, cdiv(m, triton::kBoundedSelectBlocks.key_norm_rows));
            EXPECT_EQ(recorder.launches[0].grid.y, g);
            EXPECT_EQ(bounded.grid.x, cdiv(n, triton::kBoundedSelectBlocks.rows) * g);
            EXPECT_EQ(bounded.grid.y, 1);
            EXPECT_EQ(rerun.grid.x, cdiv(n, triton::top_k_rows(k)));
            EXPECT_EQ(rerun.grid.y, g);
          }
        }
      }
    }
  }
}

TEST(TritonAot, TensorCoresScoreTheSimilaritiesTheyServeWhereAskedAndTheIeeeKernelByDefault) {
  const int64_t many = 65536;
  const auto dot = convnn::Similarity::Dot, l1 = convnn::Similarity::L1;
  ::unsetenv("CONVNN_SELECT_SCORES");
  EXPECT_EQ(triton::select_scores(dot, many, 64), triton::SelectScores::Ieee) << "estimated slower: not by default";
  ::setenv("CONVNN_SELECT_SCORES", "auto", 1);
  EXPECT_EQ(triton::select_scores(dot, many, 64), triton::SelectScores::Ieee);
  ::setenv("CONVNN_SELECT_SCORES", "ieee", 1);
  EXPECT_EQ(triton::select_scores(dot, many, 64), triton::SelectScores::Ieee);
  ::setenv("CONVNN_SELECT_SCORES", "tensor_cores", 1);
  EXPECT_EQ(triton::select_scores(dot, 10, 64), triton::SelectScores::TensorCores);
  EXPECT_EQ(triton::select_scores(convnn::Similarity::ScaledDot, many, 64), triton::SelectScores::TensorCores);
  EXPECT_EQ(triton::select_scores(convnn::Similarity::Cosine, many, 64), triton::SelectScores::TensorCores);
  EXPECT_EQ(triton::select_scores(convnn::Similarity::Gaussian, many, 64), triton::SelectScores::TensorCores);
  EXPECT_EQ(triton::select_scores(l1, many, 64), triton::SelectScores::Ieee) << "no tensor-core kernel";
  EXPECT_EQ(triton::select_scores(dot, many, triton::kBoundedSelectBlocks.max_features + 1), triton::SelectScores::Ieee)
      << "past the features the error bound holds for";
  ::setenv("CONVNN_SELECT_SCORES", "fast", 1);
  try {
    triton::select_scores(dot, many, 64);
    ADD_FAILURE() << "CONVNN_SELECT_SCORES=fast accepted";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("CONVNN_SELECT_SCORES must be 'auto', 'ieee' or 'tensor_cores', got 'fast'"),
              std::string::npos);
  }
  ::unsetenv("CONVNN_SELECT_SCORES");
}

TEST(TritonAot, SelectOnTensorCoresNamesTheCallsTheTensorCoreKernelTakesWhereAsked) {
  // What the fused knn_attention forward declines (the forward then composes this select).
  const auto queries = at::randn({2, 70, 32}), keys = at::randn({2, 150, 32});
  const auto half_queries = queries.to(at::kBFloat16), half_keys = keys.to(at::kBFloat16);
  const auto bool_mask = at::rand({70, 150}) > 0.5;
  const auto additive_mask = at::zeros({70, 150});
  const auto dot = convnn::Similarity::Dot;
  ::setenv("CONVNN_SELECT_SCORES", "tensor_cores", 1);
  EXPECT_TRUE(triton::select_on_tensor_cores(queries, keys, 8, dot, {}));
  EXPECT_TRUE(triton::select_on_tensor_cores(half_queries, half_keys, 12, dot, bool_mask));
  EXPECT_TRUE(triton::select_on_tensor_cores(queries.view({1, 2, 70, 32}), keys.view({1, 2, 150, 32}), 8,
                                             convnn::Similarity::Gaussian, {}))
      << "[B,H,N,D] heads";
  EXPECT_TRUE(triton::select_on_tensor_cores(queries, keys, 16, dot, bool_mask)) << "float32, a bool mask";
  EXPECT_FALSE(triton::select_on_tensor_cores(queries, keys, 12, dot, additive_mask))
      << "float32 with an additive mask above float32_mask_slots";
  EXPECT_FALSE(triton::select_on_tensor_cores(queries, keys, 17, dot, {})) << "K above max_slots";
  EXPECT_FALSE(triton::select_on_tensor_cores(queries, keys, 8, convnn::Similarity::L1, {})) << "not served";
  EXPECT_FALSE(triton::select_on_tensor_cores(queries.narrow(2, 0, 6), keys.narrow(2, 0, 6), 8, dot, {}))
      << "rows that are not whole chunks";
  // Key rows so far apart that tile_offset_rows of them pass 2^31 elements: a step's 32-bit offsets
  // (bounded_select._tile_offsets_fit); the same rows close together are taken.
  const int64_t step_rows = triton::kBoundedSelectBlocks.tile_offset_rows;
  const int64_t int32_rows = (std::numeric_limits<int32_t>::max() - 32) / (step_rows - 1);
  const int64_t apart = (int32_rows / 16 + 1) * 16;
  const auto wide_keys = at::empty({2 * apart + 32}).as_strided({1, 3, 32}, {2 * apart + 32, apart, 1});
  const auto first_slice = queries.narrow(0, 0, 1);
  EXPECT_TRUE(triton::select_on_tensor_cores(first_slice, keys.narrow(0, 0, 1).narrow(1, 0, 3), 2, dot, {}));
  EXPECT_FALSE(triton::select_on_tensor_cores(first_slice, wide_keys, 2, dot, {}))
      << "a step's key rows past 32-bit offsets";
  ::setenv("CONVNN_SELECT_SCORES", "ieee", 1);
  EXPECT_FALSE(triton::select_on_tensor_cores(queries, keys, 8, dot, {}));
  ::unsetenv("CONVNN_SELECT_SCORES");
  EXPECT_FALSE(triton::select_on_tensor_cores(queries, keys, 8, dot, {})) << "not by default";
}

TEST(TritonAot, SelectInIndexOrderSortsTheKernelsSlotsByIndexAndKeepsTheirScores) {
  // A runner that plays the kernel: it writes a selection in score order into the launch's scores
  // and indices (arguments 3 and 4); select_forward must then put the slots in index order.
  const auto queries = torch::randn({1, 2, 3}), keys = torch::randn({1, 5, 3});
  const auto kernel_scores = torch::tensor({{{9.0f, 7.0f, 5.0f}, {8.0f, 6.0f, 4.0f}}});
  const auto kernel_indices = torch::tensor({{{3, 0, 4}, {1, 4, 2}}}, torch::kLong);
  const triton::LaunchRunner kernel = [&](triton::Launch& launch) {
    std::memcpy(const_cast<void*>(launch.arguments.pointer_at(3)), kernel_scores.data_ptr(), 6 * sizeof(float));
    std::memcpy(const_cast<void*>(launch.arguments.pointer_at(4)), kernel_indices.data_ptr(), 6 * sizeof(int64_t));
  };
  for (const bool index_order : {false, true}) {
    const auto [scores, indices] =
        triton::select_forward(queries, keys, 3, convnn::Similarity::Dot, torch::Tensor(), index_order, kernel);
    if (!index_order) {
      EXPECT_TRUE(torch::equal(indices, kernel_indices));
      EXPECT_TRUE(torch::equal(scores, kernel_scores));
    } else {
      EXPECT_TRUE(torch::equal(indices, torch::tensor({{{0, 3, 4}, {1, 2, 4}}}, torch::kLong)));
      EXPECT_TRUE(torch::equal(scores, torch::tensor({{{7.0f, 9.0f, 5.0f}, {8.0f, 4.0f, 6.0f}}})));
    }
  }
}

TEST(TritonAot, EveryFusedAttentionLaunchPassesTheParametersTheCompiledKernelDeclares) {
  const int64_t g = 3, n = 21, m = 70, d = 5, c = 37;
  for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    const auto queries = torch::randn({g, n, d}).to(dtype), keys = torch::randn({g, m, d}).to(dtype);
    const auto values = torch::randn({g, m, c}).to(dtype);
    const std::vector<torch::Tensor> masks{torch::Tensor(), torch::rand({n, m}) > 0.3,
                                           torch::zeros({g, n, m}).to(dtype)};
    for (const auto similarity : kSimilarities) {
      for (const auto& mask : masks) {
        for (const int64_t k : {1, 9, 64}) {
          for (const auto rho : {convnn::Rho::Uniform, convnn::Rho::Mean, convnn::Rho::Softmax}) {
            Recorder recorder;
            const auto kernel = torch::randn({c, k}).to(dtype);
            const auto bias = rho == convnn::Rho::Mean ? torch::randn({c}).to(dtype) : torch::Tensor();
            const auto [output, scores, indices, weights] = triton::attention_forward(
                queries, keys, values, kernel, bias, k, similarity, mask, /*index_order=*/k == 9, rho, 0.5,
                recorder.runner());
            ASSERT_EQ(recorder.launches.size(), 1u);
            const auto& key = recorder.launches[0].key;
            EXPECT_EQ(key.rfind("attention ", 0), 0u);
            const std::string reading =
                dtype == torch::kFloat ? " mask" : std::string(" ") + triton::kernel_dtype_name(dtype) + " inputs";
            EXPECT_EQ(key.compare(key.size() - reading.size(), reading.size(), reading), 0)
                << key << ": the kernel compiled for the op's dtype";
            EXPECT_EQ(recorder.launches[0].grid.x, cdiv(n, triton::top_k_rows(k)));
            EXPECT_EQ(recorder.launches[0].grid.y, g) << "one program column per slice";
            EXPECT_EQ(output.sizes(), (std::vector<int64_t>{g, n, c}));
            EXPECT_EQ(output.scalar_type(), dtype);
            EXPECT_EQ(weights.scalar_type(), dtype);
            EXPECT_EQ(indices.sizes(), (std::vector<int64_t>{g, n, k}));
          }
        }
      }
    }
  }
}

TEST(TritonAot, EveryRhoAggregateLaunchPassesTheParametersTheCompiledKernelDeclares) {
  const int64_t g = 3, n = 45, m = 70, c = 37;
  for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    const auto values = torch::randn({g, m, c}).to(dtype);
    for (const int64_t k : {1, 9, 17, 64}) {
      for (const auto rho : {convnn::Rho::Uniform, convnn::Rho::Mean, convnn::Rho::Softmax}) {
        Recorder recorder;
        const auto scores = torch::randn({g, n, k}).to(dtype);
        const auto indices = torch::randint(0, m, {g, n, k}, torch::kLong);
        const auto bias = rho == convnn::Rho::Mean ? torch::randn({c}).to(dtype) : torch::Tensor();
        const auto [output, weights] = triton::rho_aggregate(scores, indices, values, torch::randn({c, k}).to(dtype),
                                                             bias, rho, 0.5, recorder.runner());
        ASSERT_EQ(recorder.launches.size(), 1u);
        EXPECT_EQ(recorder.launches[0].key.rfind("attention rho aggregate K<=", 0), 0u);
        EXPECT_EQ(recorder.launches[0].grid.x, cdiv(n, triton::kAttentionCodes.rho_aggregate_rows));
        EXPECT_EQ(recorder.launches[0].grid.y, g) << "one program column per slice";
        EXPECT_EQ(output.sizes(), (std::vector<int64_t>{g, n, c}));
        EXPECT_EQ(weights.sizes(), scores.sizes());
        EXPECT_EQ(output.scalar_type(), dtype);
        EXPECT_EQ(weights.scalar_type(), dtype);
      }
    }
  }
  const auto scores = torch::randn({2, 9, 6}), values = torch::randn({2, 70, 5});
  EXPECT_TRUE(triton::rho_aggregate_fits(scores, values, torch::randn({5, 6})));
  EXPECT_FALSE(triton::rho_aggregate_fits(scores, values, torch::randn({3, 5, 6}))) << "a standard kernel";
  EXPECT_FALSE(triton::rho_aggregate_fits(torch::randn({2, 9, 65}), values, torch::randn({5, 65}))) << "K above 64";
}

TEST(TritonAot, EverySoftmaxScoresGradientLaunchPassesTheParametersTheCompiledKernelDeclares) {
  const int64_t g = 3, n = 21, m = 70, c = 37;
  for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    const auto values = torch::randn({g, m, c}).to(dtype), grad_output = torch::randn({g, n, c}).to(dtype);
    for (const int64_t k : {1, 9, 17, 64}) {
      Recorder recorder;
      const auto weights = torch::rand({g, n, k}).to(dtype);
      const auto indices = torch::randint(0, m, {g, n, k}, torch::kLong);
      const auto grad_scores = triton::softmax_scores_gradient(grad_output, values, weights, indices,
                                                               torch::randn({c, k}).to(dtype), 0.5, recorder.runner());
      ASSERT_EQ(recorder.launches.size(), 1u);
      EXPECT_EQ(recorder.launches[0].grid.x, cdiv(g * n, triton::kSelectBlocks.rows));
      EXPECT_EQ(grad_scores.sizes(), weights.sizes());
      EXPECT_EQ(grad_scores.scalar_type(), dtype);
    }
  }
}

TEST(TritonAot, EveryTwoKernelBackwardLaunchPassesTheParametersTheCompiledKernelDeclares) {
  const int64_t g = 3, n = 21, m = 70, d = 70, c = 37;
  for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    const auto queries = torch::randn({g, n, d}).to(dtype), keys = torch::randn({g, m, d}).to(dtype);
    const auto values = torch::randn({g, m, c}).to(dtype), grad_output = torch::randn({g, n, c}).to(dtype);
    for (const auto similarity : {convnn::Similarity::Dot, convnn::Similarity::ScaledDot}) {
      for (const int64_t k : {1, 9, 17, 64}) {
        Recorder recorder;
        const auto slots = torch::rand({g, n, k}).to(dtype), kernel = torch::randn({c, k}).to(dtype);
        const auto indices = torch::randint(0, m, {g, n, k}, torch::kLong);
        ASSERT_TRUE(triton::attention_backward_fits(queries, keys, values, kernel, slots, similarity,
                                                    convnn::Rho::Softmax));
        const auto gradients = triton::attention_backward(grad_output, queries, keys, values, kernel, slots, indices,
                                                          slots, similarity, 0.5, recorder.runner());
        ASSERT_EQ(recorder.launches.size(), 2u) << "the row kernel and the column kernel";
        const std::string dtype_name = triton::kernel_dtype_name(dtype);
        EXPECT_EQ(recorder.launches[0].key.rfind("attention backward rows ", 0), 0u);
        EXPECT_EQ(recorder.launches[0].key.substr(recorder.launches[0].key.size() - dtype_name.size()), dtype_name)
            << "the kernel compiled for the op's dtype";
        EXPECT_EQ(recorder.launches[0].grid.x, cdiv(g * n, triton::kAttentionBackwardBlocks.row_rows));
        EXPECT_EQ(recorder.launches[1].key, "attention backward columns " + dtype_name);
        const int64_t width = triton::kAttentionBackwardBlocks.column_width;
        EXPECT_EQ(recorder.launches[1].grid.x, cdiv(g * m, triton::kAttentionBackwardBlocks.column_rows));
        EXPECT_EQ(recorder.launches[1].grid.y, cdiv(c, width) + cdiv(d, width)) << "values' parts, then keys'";
        ASSERT_EQ(gradients.size(), 5u);
        EXPECT_EQ(gradients[0].sizes(), queries.sizes());
        EXPECT_EQ(gradients[1].sizes(), keys.sizes());
        EXPECT_EQ(gradients[2].sizes(), values.sizes());
        EXPECT_EQ(gradients[3].sizes(), kernel.sizes());
        EXPECT_EQ(gradients[4].sizes(), (std::vector<int64_t>{c}));
        for (const auto& gradient : gradients) EXPECT_EQ(gradient.scalar_type(), dtype);
      }
    }
  }
}

TEST(TritonAot, TheTwoKernelBackwardTakesSoftmaxDotProductsAndDepthwiseKernelsOnly) {
  const auto queries = torch::randn({2, 9, 4}), keys = torch::randn({2, 70, 4}), values = torch::randn({2, 70, 5});
  const auto scores = torch::rand({2, 9, 6}), kernel = torch::randn({5, 6});
  using convnn::Rho;
  using convnn::Similarity;
  EXPECT_TRUE(triton::attention_backward_fits(queries, keys, values, kernel, scores, Similarity::Dot, Rho::Softmax));
  EXPECT_FALSE(triton::attention_backward_fits(queries, keys, values, kernel, scores, Similarity::Cosine,
                                               Rho::Softmax));
  EXPECT_FALSE(triton::attention_backward_fits(queries, keys, values, kernel, scores, Similarity::ScaledDot,
                                               Rho::Mean));
  EXPECT_FALSE(triton::attention_backward_fits(queries, keys, values, torch::randn({3, 5, 6}), scores,
                                               Similarity::ScaledDot, Rho::Softmax))
      << "a standard kernel";
  EXPECT_FALSE(triton::attention_backward_fits(queries, keys, values, torch::randn({5, 65}), torch::rand({2, 9, 65}),
                                               Similarity::ScaledDot, Rho::Softmax))
      << "K above 64";
  EXPECT_FALSE(triton::attention_backward_fits(queries, keys, torch::randn({2, 70, 0}), torch::randn({0, 6}), scores,
                                               Similarity::ScaledDot, Rho::Softmax))
      << "no value channels";
}

TEST(TritonAot, TheFusedAttentionTakesDepthwiseKernelsOnly) {
  const auto queries = torch::randn({2, 9, 4}), keys = torch::randn({2, 70, 4}), values = torch::randn({2, 70, 5});
  EXPECT_TRUE(triton::attention_fits(queries, keys, values, torch::randn({5, 6}), 6));
  EXPECT_FALSE(triton::attention_fits(queries, keys, values, torch::randn({3, 5, 6}), 6)) << "a standard kernel";
  EXPECT_FALSE(triton::attention_fits(queries, keys, values, torch::randn({5, 65}), 65)) << "K above 64";
  const auto grad_output = torch::randn({2, 9, 5}), weights = torch::rand({2, 9, 6});
  EXPECT_TRUE(triton::scores_gradient_fits(grad_output, values, weights, torch::randn({5, 6})));
  EXPECT_FALSE(triton::scores_gradient_fits(torch::randn({2, 9, 3}), values, weights, torch::randn({3, 5, 6})));
}

TEST(TritonAot, TheCoreOpsHaveCudaKernelsInThisBuild) {
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const char* op : {"convnn::knn_select", "convnn::knn_select_backward", "convnn::knn_aggregate",
                         "convnn::knn_aggregate_backward", "convnn::knn_attention_device_fused",
                         "convnn::knn_attention_rho_aggregate_device_fused",
                         "convnn::knn_attention_softmax_scores_gradient_device_fused",
                         "convnn::knn_attention_backward_device_fused"}) {
    EXPECT_TRUE(dispatcher.findSchemaOrThrow(op, "").hasKernelForDispatchKey(c10::DispatchKey::CUDA)) << op;
  }
}

// On a GPU: the embedded kernels against the device-generic path, and twice bitwise equal.
TEST(TritonAotCuda, AggregationEqualsTheGenericPathAndBackwardIsBitwiseRepeatable) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto on_gpu = torch::TensorOptions().device(torch::kCUDA);
  EXPECT_FALSE(triton::first_call_check(torch::Device(torch::kCUDA, 0), torch::kFloat, triton::run_on_gpu).has_value());
  const int64_t g = 4, n = 197, m = 197, c = 64, k = 9;
  const auto values = torch::randn({g, m, c}, on_gpu), weights = torch::randn({g, n, k}, on_gpu);
  const auto indices = torch::randint(0, m, {g, n, k}, on_gpu.dtype(torch::kLong));
  for (const bool standard : {false, true}) {
    const auto kernel = standard ? torch::randn({c + 3, c, k}, on_gpu) : torch::randn({c, k}, on_gpu);
    const auto bias = torch::randn({kernel.size(0)}, on_gpu);
    const auto fused = triton::aggregate_forward(values, weights, indices, kernel, bias, triton::run_on_gpu);
    const auto expected = convnn::ops::generic::knn_aggregate(values, weights, indices, kernel, bias);
    EXPECT_TRUE(torch::allclose(fused, expected, 1e-4, 1e-4)) << (standard ? "standard" : "depthwise");
    const auto grad_output = torch::randn({g, n, kernel.size(0)}, on_gpu);
    const std::array<bool, 4> all{true, true, true, true};
    const auto backward = [&] {
      return triton::aggregate_backward(grad_output, values, weights, indices, kernel, all, triton::run_on_gpu);
    };
    const auto first = backward(), second = backward();
    const auto want = convnn::ops::generic::knn_aggregate_backward(grad_output, values, weights, indices, kernel, all);
    EXPECT_TRUE(torch::allclose(std::get<0>(first), std::get<0>(want), 1e-4, 1e-4));
    EXPECT_TRUE(torch::allclose(std::get<1>(first), std::get<1>(want), 1e-4, 1e-4));
    EXPECT_TRUE(torch::allclose(std::get<2>(first), std::get<2>(want), 1e-3, 1e-3));
    EXPECT_TRUE(torch::equal(std::get<0>(first), std::get<0>(second)));
    EXPECT_TRUE(torch::equal(std::get<2>(first), std::get<2>(second)));
  }
}

// On a GPU: knn_select on integer-valued features picks exactly the generic path's indices (every
// score exact, ties included), for every similarity and mask kind; its backward equals the generic
// one to rounding.
TEST(TritonAotCuda, SelectPicksTheGenericPathsIndicesAndItsBackwardEqualsTheGenericOne) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto on_gpu = torch::TensorOptions().device(torch::kCUDA);
  const int64_t g = 3, n = 40, m = 150, d = 6;
  const auto queries = torch::randint(-3, 4, {g, n, d}, on_gpu), keys = torch::randint(-3, 4, {g, m, d}, on_gpu);
  const std::vector<torch::Tensor> masks{torch::Tensor(), torch::rand({g, n, m}, on_gpu) > 0.3,
                                         torch::where(torch::rand({n, m}, on_gpu) > 0.5, 0.0, -INFINITY)};
  for (const auto similarity : kSimilarities) {
    for (const auto& mask : masks) {
      for (const bool index_order : {false, true}) {
        const auto mask_arg = mask.defined() ? c10::optional<torch::Tensor>(mask) : c10::nullopt;
        const auto [scores, indices] =
            triton::select_forward(queries, keys, 9, similarity, mask, index_order, triton::run_on_gpu);
        const auto [want_scores, want_indices] = convnn::ops::generic::knn_select(
            queries, keys, 9, convnn::to_string(similarity), mask_arg, index_order);
        EXPECT_TRUE(torch::equal(indices, want_indices)) << convnn::to_string(similarity);
        EXPECT_TRUE(torch::allclose(scores, want_scores, 1e-5, 0.0)) << convnn::to_string(similarity);
      }
    }
    const auto real_queries = torch::randn({g, n, d}, on_gpu) * 0.3, real_keys = torch::randn({g, m, d}, on_gpu) * 0.3;
    const auto [scores, indices] = convnn::ops::generic::knn_select(real_queries, real_keys, 9,
                                                                    convnn::to_string(similarity), c10::nullopt, false);
    const auto grad_scores = torch::randn(scores.sizes(), on_gpu);
    const auto fused =
        triton::select_backward(grad_scores, real_queries, real_keys, indices, scores, similarity, triton::run_on_gpu);
    const auto want = convnn::ops::generic::knn_select_backward(grad_scores, real_queries, real_keys, indices, scores,
                                                                convnn::to_string(similarity));
    EXPECT_TRUE(torch::allclose(std::get<0>(fused), std::get<0>(want), 1e-4, 1e-5)) << convnn::to_string(similarity);
    EXPECT_TRUE(torch::allclose(std::get<1>(fused), std::get<1>(want), 1e-4, 1e-5)) << convnn::to_string(similarity);
  }
}

// On a GPU: the fused knn_attention on integer-valued features picks exactly the generic path's
// indices, and its other outputs equal the generic ones to rounding, for every similarity, rho and
// mask kind, in both slot orders; knn_attention on CUDA tensors runs it.
TEST(TritonAotCuda, FusedAttentionEqualsTheGenericPath) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto on_gpu = torch::TensorOptions().device(torch::kCUDA);
  const int64_t g = 3, n = 40, m = 150, d = 4, c = 40;
  const auto queries = torch::randint(-3, 4, {g, n, d}, on_gpu), keys = torch::randint(-3, 4, {g, m, d}, on_gpu);
  const auto values = torch::randn({g, m, c}, on_gpu), kernel = torch::randn({c, 9}, on_gpu);
  const auto bias = torch::randn({c}, on_gpu);
  const std::vector<torch::Tensor> masks{torch::Tensor(), torch::rand({g, n, m}, on_gpu) > 0.3,
                                         torch::where(torch::rand({n, m}, on_gpu) > 0.5, 0.0, -INFINITY)};
  for (const auto similarity : kSimilarities) {
    for (const auto rho : {convnn::Rho::Uniform, convnn::Rho::Mean, convnn::Rho::Softmax}) {
      for (const auto& mask : masks) {
        for (const bool index_order : {false, true}) {
          const auto mask_arg = mask.defined() ? c10::optional<torch::Tensor>(mask) : c10::nullopt;
          const auto fused = triton::attention_forward(queries, keys, values, kernel, bias, 9, similarity, mask,
                                                       index_order, rho, 0.5, triton::run_on_gpu);
          const auto want = convnn::ops::generic::knn_attention(queries, keys, values, kernel, bias, 9,
                                                                convnn::to_string(similarity), mask_arg, index_order,
                                                                convnn::to_string(rho), 0.5);
          const std::string what = std::string(convnn::to_string(similarity)) + " " + convnn::to_string(rho);
          EXPECT_TRUE(torch::equal(std::get<2>(fused), std::get<2>(want))) << what;
          EXPECT_TRUE(torch::allclose(std::get<0>(fused), std::get<0>(want), 1e-5, 1e-5)) << what;
          EXPECT_TRUE(torch::allclose(std::get<1>(fused), std::get<1>(want), 1e-5, 0.0, true)) << what;
          EXPECT_TRUE(torch::allclose(std::get<3>(fused), std::get<3>(want), 1e-5, 1e-6)) << what;
        }
      }
    }
  }
  const auto through_the_op = convnn::ops::knn_attention(queries, keys, values, kernel, bias, 9, "scaled_dot",
                                                         c10::nullopt, false, "softmax", 1.0);
  const auto direct = triton::attention_forward(queries, keys, values, kernel, bias, 9, convnn::Similarity::ScaledDot,
                                                torch::Tensor(), false, convnn::Rho::Softmax, 1.0, triton::run_on_gpu);
  EXPECT_TRUE(torch::equal(std::get<0>(through_the_op), std::get<0>(direct))) << "knn_attention runs the fused kernel";
  // The backward with the fused softmax scores gradient against the generic backward.
  const auto real_queries = torch::randn({g, n, 8}, on_gpu), real_keys = torch::randn({g, m, 8}, on_gpu);
  const auto [output, scores, indices, weights] = convnn::ops::generic::knn_attention(
      real_queries, real_keys, values, kernel, bias, 9, "cosine", c10::nullopt, false, "softmax", 0.5);
  const auto grad_output = torch::randn(output.sizes(), on_gpu);
  const std::array<bool, 5> all{true, true, true, true, true};
  const auto fused = convnn::ops::knn_attention_backward(grad_output, real_queries, real_keys, values, kernel, scores,
                                                         indices, weights, "cosine", "softmax", 0.5, all);
  const auto want = convnn::ops::generic::knn_attention_backward(grad_output, real_queries, real_keys, values, kernel,
                                                                 scores, indices, weights, "cosine", "softmax", 0.5,
                                                                 all);
  EXPECT_TRUE(torch::allclose(std::get<0>(fused), std::get<0>(want), 1e-4, 1e-5)) << "d queries";
  EXPECT_TRUE(torch::allclose(std::get<1>(fused), std::get<1>(want), 1e-4, 1e-5)) << "d keys";
  EXPECT_TRUE(torch::allclose(std::get<2>(fused), std::get<2>(want), 1e-4, 1e-5)) << "d values";
  // scaled_dot: the two-kernel backward, through the op, against the generic backward; bitwise repeatable.
  const auto [dot_output, dot_scores, dot_indices, dot_weights] = convnn::ops::generic::knn_attention(
      real_queries, real_keys, values, kernel, bias, 9, "scaled_dot", c10::nullopt, false, "softmax", 0.5);
  const auto backward = [&] {
    return convnn::ops::knn_attention_backward(grad_output, real_queries, real_keys, values, kernel, dot_scores,
                                               dot_indices, dot_weights, "scaled_dot", "softmax", 0.5, all);
  };
  const auto two_kernels = backward(), again = backward();
  const auto expected = convnn::ops::generic::knn_attention_backward(grad_output, real_queries, real_keys, values,
                                                                     kernel, dot_scores, dot_indices, dot_weights,
                                                                     "scaled_dot", "softmax", 0.5, all);
  EXPECT_TRUE(torch::allclose(std::get<0>(two_kernels), std::get<0>(expected), 1e-4, 1e-5)) << "d queries";
  EXPECT_TRUE(torch::allclose(std::get<1>(two_kernels), std::get<1>(expected), 1e-4, 1e-5)) << "d keys";
  EXPECT_TRUE(torch::allclose(std::get<2>(two_kernels), std::get<2>(expected), 1e-4, 1e-5)) << "d values";
  EXPECT_TRUE(torch::allclose(std::get<3>(two_kernels), std::get<3>(expected), 1e-4, 1e-4)) << "d kernel";
  EXPECT_TRUE(torch::equal(std::get<1>(two_kernels), std::get<1>(again))) << "d keys bitwise repeatable";
  EXPECT_TRUE(torch::equal(std::get<2>(two_kernels), std::get<2>(again))) << "d values bitwise repeatable";
}

// On a GPU: the forwards that write their outputs in the op's dtype through pointers compiled as
// float32 (the fused forward, the composed forward's rho and aggregation) write every slice's rows
// where the generic path does, in bfloat16 and float16 (a slice start added to the float32 pointer
// before its cast put slice g at twice its offset).
TEST(TritonAotCuda, HalfPrecisionForwardsWriteEverySlicesRowsInTheOpsDtype) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t g = 5, n = 40, m = 150, d = 4, c = 40, k = 9;
  for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
    const auto on_gpu = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
    const auto queries = torch::randint(-3, 4, {g, n, d}, on_gpu), keys = torch::randint(-3, 4, {g, m, d}, on_gpu);
    const auto values = torch::randn({g, m, c}, on_gpu), kernel = torch::randn({c, k}, on_gpu);
    const auto bias = torch::randn({c}, on_gpu);
    const auto want = convnn::ops::generic::knn_attention(queries, keys, values, kernel, bias, k, "scaled_dot",
                                                          c10::nullopt, false, "softmax", 0.5);
    const auto fused = triton::attention_forward(queries, keys, values, kernel, bias, k, convnn::Similarity::ScaledDot,
                                                 torch::Tensor(), false, convnn::Rho::Softmax, 0.5, triton::run_on_gpu);
    const auto [output, weights] = triton::rho_aggregate(std::get<1>(want), std::get<2>(want), values, kernel, bias,
                                                         convnn::Rho::Softmax, 0.5, triton::run_on_gpu);
    const auto close = [](const torch::Tensor& a, const torch::Tensor& b) {
      return torch::allclose(a.to(torch::kFloat), b.to(torch::kFloat), 2e-2, 2e-2);
    };
    EXPECT_TRUE(torch::equal(std::get<2>(fused), std::get<2>(want))) << dtype;
    EXPECT_TRUE(close(std::get<0>(fused), std::get<0>(want))) << dtype << ": the fused forward's output";
    EXPECT_TRUE(close(std::get<3>(fused), std::get<3>(want))) << dtype << ": the fused forward's weights";
    EXPECT_TRUE(close(output, std::get<0>(want))) << dtype << ": rho and aggregation, output";
    EXPECT_TRUE(close(weights, std::get<3>(want))) << dtype << ": rho and aggregation, weights";
  }
}

}  // namespace triton_aot_test

#else

// A build without the embedded kernels (no nvcc, no triton, or CONVNN_TRITON_AOT=OFF) says so.
TEST(TritonAot, NotInThisBuild) { GTEST_SKIP() << "this build does not embed the Triton kernels"; }

#endif
