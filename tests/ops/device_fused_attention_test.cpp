// The hook through which a device's fused knn_attention kernel serves knn_attention
// (convnn::knn_attention_device_fused, src/ops/cuda/knn_attention_composed.cpp): the device's
// knn_attention asks it first and composes the core ops when it answers with no tensors. Proved here
// with a kernel of this test binary's own under the CPU key, which no library code asks (the CPU
// knn_attention has its fused C++ kernel); on CUDA the Triton kernel answers the same way.
#include <gtest/gtest.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <vector>

#include "ops/cuda/knn_attention_composed.h"

namespace {

// No tensors for K = 1 (the inputs it "does not take"), three for K = 2 (a broken kernel), else
// recognisable outputs of knn_attention's shapes.
std::vector<at::Tensor> test_kernel(const at::Tensor& queries, const at::Tensor&, const at::Tensor& values,
                                    const at::Tensor&, const c10::optional<at::Tensor>&, int64_t k,
                                    c10::string_view, const c10::optional<at::Tensor>&, bool, c10::string_view,
                                    double) {
  if (k == 1) return {};
  const int64_t g = queries.size(0), n = queries.size(1);
  auto slots = at::full({g, n, k}, 7.0, queries.options());
  if (k == 2) return {slots, slots, slots};
  return {at::full({g, n, values.size(2)}, 42.0, values.options()), slots,
          at::zeros({g, n, k}, queries.options().dtype(at::kLong)), slots};
}

TORCH_LIBRARY_IMPL(convnn, CPU, m) { m.impl("knn_attention_device_fused", &test_kernel); }

struct Operands {
  torch::Tensor queries = torch::randn({2, 5, 3}), keys = torch::randn({2, 8, 3}), values = torch::randn({2, 8, 4});
  torch::Tensor kernel(int64_t k) const { return torch::randn({4, k}); }
};

TEST(DeviceFusedAttention, TheDevicesKernelAnswersWhereItTakesTheInputs) {
  const Operands in;
  const auto fused = convnn::ops::cuda::device_fused_attention(c10::DispatchKey::CPU, in.queries, in.keys, in.values,
                                                               in.kernel(3), c10::nullopt, 3, "dot", c10::nullopt,
                                                               false, "softmax", 1.0);
  ASSERT_TRUE(fused.has_value());
  EXPECT_TRUE(torch::equal(std::get<0>(*fused), torch::full({2, 5, 4}, 42.0)));
}

TEST(DeviceFusedAttention, NoTensorsMeansCompose) {
  const Operands in;
  EXPECT_FALSE(convnn::ops::cuda::device_fused_attention(c10::DispatchKey::CPU, in.queries, in.keys, in.values,
                                                         in.kernel(1), c10::nullopt, 1, "dot", c10::nullopt, false,
                                                         "softmax", 1.0)
                   .has_value());
}

TEST(DeviceFusedAttention, AKeyWithoutAFusedKernelIsNotAsked) {
  const Operands in;
  EXPECT_FALSE(convnn::ops::cuda::device_fused_attention(c10::DispatchKey::XPU, in.queries, in.keys, in.values,
                                                         in.kernel(3), c10::nullopt, 3, "dot", c10::nullopt, false,
                                                         "softmax", 1.0)
                   .has_value());
}

TEST(DeviceFusedAttention, AKernelReturningAnotherNumberOfTensorsIsAnError) {
  const Operands in;
  try {
    convnn::ops::cuda::device_fused_attention(c10::DispatchKey::CPU, in.queries, in.keys, in.values, in.kernel(2),
                                              c10::nullopt, 2, "dot", c10::nullopt, false, "softmax", 1.0);
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("returned 3 tensors, not the 4 of knn_attention"), std::string::npos)
        << error.what();
  }
}

TEST(DeviceFusedAttention, KnnAttentionsChecksRunBeforeTheDevicesKernel) {
  const Operands in;
  try {
    convnn::ops::cuda::device_fused_attention(c10::DispatchKey::CPU, in.queries, in.keys, in.values, in.kernel(3),
                                              c10::nullopt, 3, "no such similarity", c10::nullopt, false, "softmax",
                                              1.0);
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("knn_attention: similarity"), std::string::npos) << error.what();
  }
}

}  // namespace
