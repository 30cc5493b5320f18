// The Triton route's path choice (src/ops/cuda/triton/path_choice.h, routes.h), on CPU tensors
// through the ops' CUDA kernels: every call says why it takes the ATen path, the answer is the
// generic path's, and a launcher whose kernels disagree with the generic path is caught by the
// first-call check and turned off with one warning.
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "support/build_features.h"

#if CONVNN_BUILD_TRITON_ROUTE
#include "ops/cuda/triton/aggregate_launches.h"
#include "ops/cuda/triton/attention_launches.h"
#include "ops/cuda/triton/sorted_keys.h"

namespace {

using SelectFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, int64_t, c10::string_view,
                                                    const c10::optional<at::Tensor>&, bool);

// knn_select's CUDA kernel (the Triton route's choice), whatever the tensors' device.
std::tuple<at::Tensor, at::Tensor> cuda_select(const at::Tensor& queries, const at::Tensor& keys, int64_t k,
                                               const char* similarity = "l1") {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("convnn::knn_select", "").typed<SelectFn>();
  return op.redispatch(c10::DispatchKeySet(c10::DispatchKey::CUDA), queries, keys, k, similarity, c10::nullopt,
                       false);
}

std::tuple<at::Tensor, at::Tensor> generic_select(const at::Tensor& queries, const at::Tensor& keys, int64_t k) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("convnn::knn_select", "").typed<SelectFn>();
  return op.redispatch(c10::DispatchKeySet(c10::DispatchKey::CompositeExplicitAutograd), queries, keys, k, "l1",
                       c10::nullopt, false);
}

std::vector<std::string> path_log(bool recording) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("convnn::cuda_path_log", "")
                             .typed<std::vector<std::string>(bool)>();
  return op.call(recording);
}

// The warnings raised on this thread while it lives.
struct Warnings : c10::WarningHandler {
  std::vector<std::string> messages;
  c10::WarningUtils::WarningHandlerGuard guard{this};
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
};

void forget_first_call_checks() {
  c10::Dispatcher::singleton().findSchemaOrThrow("convnn::_cuda_path_checks_reset", "").typed<void()>().call();
}

// The reason after "knn_select: " of the one call that `call` makes.
template <typename Call>
std::string why(Call call) {
  path_log(true);
  call();
  const auto entries = path_log(false);
  EXPECT_EQ(entries.size(), 1u);
  const std::string prefix = "knn_select: ";
  return entries.empty() || entries[0].rfind(prefix, 0) != 0 ? "" : entries[0].substr(prefix.size());
}

}  // namespace

TEST(TritonRoute, EveryCallSaysWhyItTakesTheAtenPathAndGetsTheGenericAnswer) {
  const auto queries = torch::randint(-3, 4, {2, 9, 5}).to(torch::kFloat);
  const auto keys = torch::randint(-3, 4, {2, 70, 5}).to(torch::kFloat);
  EXPECT_EQ(why([&] { cuda_select(queries.to(torch::kDouble), keys.to(torch::kDouble), 6); }),
            "ATen path: dtype Double (the Triton kernels take float32, bfloat16 and float16)");
  EXPECT_EQ(why([&] { cuda_select(queries, keys, 65); }).rfind("ATen path: K, a size or a grid past", 0), 0u);
  ::setenv("CONVNN_CUDA_KERNELS", "generic", 1);
  EXPECT_EQ(why([&] { cuda_select(queries, keys, 6); }), "ATen path: CONVNN_CUDA_KERNELS=generic");
  ::unsetenv("CONVNN_CUDA_KERNELS");
  // No launcher here: no Python package, and the embedded images (where built) need CUDA tensors.
  std::tuple<at::Tensor, at::Tensor> got;
  const auto reason = why([&] { got = cuda_select(queries, keys, 6); });
  EXPECT_NE(reason.find("the Python package's Triton launcher is not registered"), std::string::npos) << reason;
  const auto want = generic_select(queries, keys, 6);
  EXPECT_TRUE(torch::equal(std::get<1>(got), std::get<1>(want)));
  EXPECT_TRUE(torch::equal(std::get<0>(got), std::get<0>(want)));
  EXPECT_TRUE(path_log(false).empty()) << "nothing is kept while not recording";
}

TEST(TritonRoute, AWrongCudaKernelSwitchIsRefusedByName) {
  ::setenv("CONVNN_CUDA_KERNELS", "triton", 1);
  const auto queries = torch::randn({2, 9, 5}), keys = torch::randn({2, 70, 5});
  try {
    cuda_select(queries, keys, 6);
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("CONVNN_CUDA_KERNELS must be 'fused' or 'generic', got 'triton'"),
              std::string::npos);
  }
  ::unsetenv("CONVNN_CUDA_KERNELS");
}

TEST(TritonRoute, ALauncherThatGetsTheFirstCallCheckWrongIsTurnedOffWithOneWarning) {
  // A Python launcher that launches nothing: the check's outputs stay as allocated, so the first
  // kernel checked (the aggregation's forward) disagrees with the generic path.
  std::vector<std::string> launched;
  {
    torch::Library launcher(torch::Library::IMPL, "convnn", c10::DispatchKey::CUDA, __FILE__, __LINE__);
    launcher.impl("_triton_launch",
                  [&launched](c10::string_view key, at::IntArrayRef, const c10::List<c10::optional<at::Tensor>>&,
                              at::IntArrayRef, at::ArrayRef<double>, c10::string_view) { launched.emplace_back(key); });
    forget_first_call_checks();
    const auto queries = torch::randn({2, 9, 5}), keys = torch::randn({2, 70, 5});
    Warnings warnings;
    std::tuple<at::Tensor, at::Tensor> got;
    const auto reason = why([&] { got = cuda_select(queries, keys, 6); });
    EXPECT_EQ(reason,
              "ATen path: the first-call check found the Triton kernel knn_aggregate (depthwise, forward) wrong on cpu "
              "(Float, python route)");
    ASSERT_FALSE(launched.empty());
    EXPECT_EQ(launched[0], "forward float32 bias");
    ASSERT_EQ(warnings.messages.size(), 1u);
    EXPECT_NE(warnings.messages[0].find("disagrees with the generic path"), std::string::npos);
    EXPECT_TRUE(torch::equal(std::get<1>(got), std::get<1>(generic_select(queries, keys, 6))));
    // Remembered: no second check, no second warning.
    const auto checked = launched.size();
    EXPECT_EQ(why([&] { cuda_select(queries, keys, 6); }), reason);
    EXPECT_EQ(launched.size(), checked);
    EXPECT_EQ(warnings.messages.size(), 1u);
  }
  forget_first_call_checks();
}

TEST(TritonRoute, TheColumnKernelTakesTheRowsByRunLengthLongestFirstTiesInRowOrder) {
  // A hub row 0 (read by every query), rows read by some and rows read by none.
  const auto indices = torch::tensor({0, 3, 0, 5, 0, 3, 0, 1}, torch::kLong).view({1, 4, 2});
  const auto [order, run_start] = convnn::ops::cuda::triton::inverse_index(indices, 7);
  const auto rows = convnn::ops::cuda::triton::busiest_first(run_start, 4 * 2);
  EXPECT_TRUE(torch::equal(rows, torch::tensor({0, 3, 1, 5, 2, 4, 6}, torch::kInt)));
}

TEST(TritonRoute, SortedKeysAreAStableSortOverTheKeysLowBits) {
  namespace triton = convnn::ops::cuda::triton;
  EXPECT_EQ(triton::bits_for(0), 1);
  EXPECT_EQ(triton::bits_for(1), 1);
  EXPECT_EQ(triton::bits_for(2), 2);
  EXPECT_EQ(triton::bits_for(196607), 18);  // 12 heads of 16384 keys: three passes of 8-bit digits
  EXPECT_EQ(triton::bits_for(196608), 18);
  EXPECT_EQ(triton::bits_for(262143), 18);
  EXPECT_EQ(triton::bits_for(262144), 19);
  const auto keys = torch::tensor({5, 2, 7, 2, 0, 5, 7, 1}, torch::kInt);
  const auto up = triton::sorted_keys(keys, 3, /*descending=*/false);
  EXPECT_TRUE(torch::equal(up.keys, torch::tensor({0, 1, 2, 2, 5, 5, 7, 7}, torch::kInt)));
  EXPECT_TRUE(torch::equal(up.positions, torch::tensor({4, 7, 1, 3, 0, 5, 2, 6}, torch::kInt)));
  const auto down = triton::sorted_keys(keys, 3, /*descending=*/true);
  EXPECT_TRUE(torch::equal(down.keys, torch::tensor({7, 7, 5, 5, 2, 2, 1, 0}, torch::kInt)));
  EXPECT_TRUE(torch::equal(down.positions, torch::tensor({2, 6, 0, 5, 1, 3, 7, 4}, torch::kInt)));
  const auto none = triton::sorted_keys(torch::empty({0}, torch::kInt), 1, false);
  EXPECT_EQ(none.positions.numel(), 0);
  EXPECT_EQ(none.positions.scalar_type(), torch::kInt);
}

#else

TEST(TritonRoute, NotInThisBuild) { GTEST_SKIP() << "this build has no Triton route (its Python has no triton)"; }

#endif
