// The device sweep: every backend dispatch key the dispatcher has a convnn kernel for
// (support/registered_devices.h) runs the ops on its device against the plain-ATen reference on the
// CPU; a key registered for a device this machine does not have shows as skipped, by name. The keys
// come from the registrations themselves, so a device added as files under src/ops/<key>/ is swept
// with no edit here. Which keys this build registers is checked too: the CPU's fused kernels unless
// CONVNN_CPU_KERNELS=generic, and the CUDA knn_attention composition in every build.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <limits>
#include <string>
#include <vector>

#include "convnn/ops/knn_ops.h"
#include "ops/generic/generic.h"
#include "ops/reference/reference.h"
#include "support/assert_close.h"
#include "support/build_features.h"
#include "support/enum_lists.h"
#include "support/registered_devices.h"

namespace {

using convnn::Rho;
using convnn::Similarity;
using convnn::testing::AllClose;
using convnn::testing::BackendKey;

constexpr double kTemperature = 0.7;

std::string key_name(c10::DispatchKey key) { return c10::toString(key); }

bool is_registered(c10::DispatchKey key) {
  const auto registered = convnn::testing::registered_backend_keys();
  return std::any_of(registered.begin(), registered.end(),
                     [&](const BackendKey& backend) { return backend.key == key; });
}

TEST(RegisteredDevices, CpuKeyIsFoundUnlessTheGenericPathServesTheCpu) {
  // CONVNN_CPU_KERNELS=generic leaves src/ops/cpu's registrations empty (generic::serves_cpu()).
  const bool fused_cpu = !convnn::ops::generic::serves_cpu();
  EXPECT_EQ(is_registered(c10::DispatchKey::CPU), fused_cpu);
  const auto expected = fused_cpu ? convnn::testing::core_op_names() : std::vector<std::string>{};
  EXPECT_EQ(convnn::testing::ops_registered_for(c10::DispatchKey::CPU), expected);
}

TEST(RegisteredDevices, CudaKeyIsFoundInEveryBuildThroughTheAttentionComposition) {
  // src/ops/cuda/knn_attention_cuda.cpp registers knn_attention and its backward under CUDA in
  // every build; a build with the Triton route (src/ops/cuda/triton/routes.h) adds the core ops.
  EXPECT_TRUE(is_registered(c10::DispatchKey::CUDA));
#if CONVNN_BUILD_TRITON_ROUTE
  const auto& expected = convnn::testing::core_op_names();
#else
  const std::vector<std::string> expected{"knn_attention", "knn_attention_backward"};
#endif
  EXPECT_EQ(convnn::testing::ops_registered_for(c10::DispatchKey::CUDA), expected);
}

TEST(RegisteredDevices, KeysWithoutAKernelOfTheirOwnAreNotFound) {
  // XPU and MPS reach the generic path through CompositeExplicitAutograd, which is no kernel of
  // their own; the sweep must not take them for registered backends.
  EXPECT_FALSE(is_registered(c10::DispatchKey::XPU));
  EXPECT_FALSE(is_registered(c10::DispatchKey::MPS));
  EXPECT_TRUE(convnn::testing::ops_registered_for(c10::DispatchKey::XPU).empty());
  std::vector<std::string> found;
  for (const auto& backend : convnn::testing::registered_backend_keys()) found.push_back(key_name(backend.key));
  std::vector<std::string> expected;
  if (!convnn::ops::generic::serves_cpu()) expected.push_back("CPU");
  expected.push_back("CUDA");
  EXPECT_EQ(found, expected);
}

enum class MaskKind { None, Bool, Additive };

struct Case {
  Similarity similarity;
  Rho rho;
  bool depthwise, bias, index_order;
  MaskKind mask;
  int64_t k;
  std::string name() const {
    return std::string(convnn::to_string(similarity)) + " " + convnn::to_string(rho) +
           (depthwise ? " depthwise" : " standard") +
           (bias ? " bias" : "") + (index_order ? " index-order" : " score-order") +
           " mask=" + std::to_string(static_cast<int>(mask)) + " K=" + std::to_string(k);
  }
};

// Every similarity x rho x kernel kind; bias, slot order, mask and K cycle through the cases.
std::vector<Case> sweep() {
  std::vector<Case> cases;
  int variant = 0;
  for (const auto similarity : convnn::testing::all_similarities()) {
    for (const auto rho : convnn::testing::all_rhos()) {
      for (const bool depthwise : {true, false}) {
        ++variant;
        cases.push_back({similarity, rho, depthwise, variant % 2 == 0, variant % 4 < 2,
                         static_cast<MaskKind>(variant % 3), int64_t{1 + variant % 4}});
      }
    }
  }
  return cases;
}

struct Inputs {
  torch::Tensor queries, keys, values, kernel, bias, mask;
  static c10::optional<torch::Tensor> optional(const torch::Tensor& t) {
    return t.defined() ? c10::optional<torch::Tensor>(t) : c10::nullopt;
  }
  c10::optional<torch::Tensor> optional_bias() const { return optional(bias); }
  c10::optional<torch::Tensor> optional_mask() const { return optional(mask); }
  Inputs to(const c10::Device& device) const {
    Inputs moved = *this;
    for (auto* t : {&moved.queries, &moved.keys, &moved.values, &moved.kernel, &moved.bias, &moved.mask}) {
      if (t->defined()) *t = t->to(device);
    }
    return moved;
  }
};

constexpr int64_t kSlices = 2, kQueries = 6, kCandidates = 7, kDim = 3, kChannels = 3;

Inputs make_inputs(const Case& c, torch::ScalarType dtype, uint64_t seed) {
  torch::manual_seed(seed);
  const auto opts = torch::TensorOptions().dtype(dtype);
  Inputs in;
  in.queries = torch::randn({kSlices, kQueries, kDim}, opts);
  in.keys = torch::randn({kSlices, kCandidates, kDim}, opts);
  in.values = torch::randn({kSlices, kCandidates, kChannels}, opts);
  in.kernel = c.depthwise ? torch::randn({kChannels, c.k}, opts)
                          : torch::randn({kChannels + 1, kChannels, c.k}, opts);
  if (c.bias) in.bias = torch::randn({in.kernel.size(0)}, opts);
  // Every row keeps its first K candidates, so that each has K valid ones and no row is unrankable.
  const auto allowed = (torch::rand({kQueries, kCandidates}) > 0.3).logical_or(torch::arange(kCandidates) < c.k);
  if (c.mask == MaskKind::Bool) in.mask = allowed;
  if (c.mask == MaskKind::Additive) {
    in.mask = torch::zeros({kQueries, kCandidates}, opts).masked_fill(allowed.logical_not(),
                                                                     -std::numeric_limits<double>::infinity());
  }
  return in;
}

// The ops on one registered backend's device, against the plain-ATen reference on the CPU: the same
// indices, and scores, weights, outputs and every gradient of the forward and backward ops within
// the tolerance. One test per backend key, named by it; a key without a kernel of its own, or whose
// device this machine lacks, is skipped with a message naming it.
class RegisteredDeviceSweep : public ::testing::TestWithParam<BackendKey> {};

TEST_P(RegisteredDeviceSweep, OpsOnTheDeviceEqualTheCpuReference) {
  const BackendKey backend = GetParam();
  const auto registered = convnn::testing::ops_registered_for(backend.key);
  if (registered.empty()) GTEST_SKIP() << "no convnn kernel registered for " << backend.key;
  if (!convnn::testing::device_present(backend.device)) {
    GTEST_SKIP() << backend.key << ": convnn kernels registered, but this machine has no " << backend.device
                 << " device";
  }
  const c10::Device device(backend.device);
  // MPS has no float64: there the reference runs in float32 too, within float32's tolerance.
  const auto dtype = backend.device == c10::DeviceType::MPS ? torch::kFloat : torch::kDouble;
  const double tolerance = dtype == torch::kDouble ? 1e-10 : 1e-4;
  const auto close = [&](const torch::Tensor& on_device, const torch::Tensor& expected) {
    ASSERT_EQ(on_device.defined(), expected.defined());
    if (!expected.defined()) return;
    EXPECT_EQ(on_device.device().type(), backend.device);
    EXPECT_TRUE(AllClose(on_device.cpu(), expected, tolerance, tolerance));
  };
  uint64_t seed = 500;
  for (const auto& c : sweep()) {
    SCOPED_TRACE(key_name(backend.key) + ": " + c.name());
    const auto in = make_inputs(c, dtype, ++seed);
    const auto on_device = in.to(device);
    const auto similarity = convnn::to_string(c.similarity), rho = convnn::to_string(c.rho);

    const auto [scores, indices] =
        convnn::reference::knn_select(in.queries, in.keys, c.k, c.similarity, in.optional_mask(), c.index_order);
    const auto [device_scores, device_indices] = convnn::ops::knn_select(
        on_device.queries, on_device.keys, c.k, similarity, on_device.optional_mask(), c.index_order);
    EXPECT_TRUE(torch::equal(device_indices.cpu(), indices));
    close(device_scores, scores);

    const auto grad_scores = torch::randn_like(scores);
    const auto [grad_queries, grad_keys] =
        convnn::reference::knn_select_backward(grad_scores, in.queries, in.keys, indices, scores, c.similarity);
    const auto [device_grad_queries, device_grad_keys] = convnn::ops::knn_select_backward(
        grad_scores.to(device), on_device.queries, on_device.keys, indices.to(device), scores.to(device),
        similarity);
    close(device_grad_queries, grad_queries);
    close(device_grad_keys, grad_keys);

    const auto weights = convnn::reference::rho_weights(scores, c.rho, kTemperature);
    const auto output =
        convnn::reference::knn_aggregate(in.values, weights, indices, in.kernel, in.optional_bias());
    close(convnn::ops::knn_aggregate(on_device.values, weights.to(device), indices.to(device), on_device.kernel,
                                     on_device.optional_bias()),
          output);
    const auto grad_output = torch::randn_like(output);
    const std::array<bool, 4> every_aggregate_gradient{true, true, true, c.bias};
    const auto aggregate_grads = convnn::reference::knn_aggregate_backward(
        grad_output, in.values, weights, indices, in.kernel, every_aggregate_gradient);
    const auto device_aggregate_grads = convnn::ops::knn_aggregate_backward(
        grad_output.to(device), on_device.values, weights.to(device), indices.to(device), on_device.kernel,
        every_aggregate_gradient);
    close(std::get<0>(device_aggregate_grads), std::get<0>(aggregate_grads));
    close(std::get<1>(device_aggregate_grads), std::get<1>(aggregate_grads));
    close(std::get<2>(device_aggregate_grads), std::get<2>(aggregate_grads));
    close(std::get<3>(device_aggregate_grads), std::get<3>(aggregate_grads));

    // The attention's gradients: ATen autograd through the reference composition, on the CPU.
    std::vector<torch::Tensor> leaves{in.queries, in.keys, in.values, in.kernel};
    if (c.bias) leaves.push_back(in.bias);
    for (auto& leaf : leaves) leaf = leaf.detach().clone().requires_grad_();
    const auto [attention_output, attention_scores, attention_indices, attention_weights] =
        convnn::reference::knn_attention(leaves[0], leaves[1], leaves[2], leaves[3],
                                         Inputs::optional(c.bias ? leaves[4] : torch::Tensor()), c.k,
                                         c.similarity, in.optional_mask(), c.index_order, c.rho, kTemperature);
    const auto [device_output, device_attention_scores, device_attention_indices, device_weights] =
        convnn::ops::knn_attention(on_device.queries, on_device.keys, on_device.values, on_device.kernel,
                                   on_device.optional_bias(), c.k, similarity, on_device.optional_mask(),
                                   c.index_order, rho, kTemperature);
    EXPECT_TRUE(torch::equal(device_attention_indices.cpu(), attention_indices));
    close(device_output, attention_output.detach());
    close(device_attention_scores, attention_scores.detach());
    close(device_weights, attention_weights.detach());

    const auto grad_attention = torch::randn_like(output);
    const auto expected_grads = torch::autograd::grad({attention_output}, leaves, {grad_attention},
                                                      /*retain_graph=*/false, /*create_graph=*/false,
                                                      /*allow_unused=*/true);
    const auto device_grads = convnn::ops::knn_attention_backward(
        grad_attention.to(device), on_device.queries, on_device.keys, on_device.values, on_device.kernel,
        device_attention_scores, device_attention_indices, device_weights, similarity, rho, kTemperature,
        {true, true, true, true, c.bias});
    // A rho that ignores the score values (uniform, mean) gives no query or key gradient: zero
    // in the reference's autograd, undefined from the op.
    const auto close_or_zero = [&](const torch::Tensor& on_device_grad, const torch::Tensor& expected) {
      if (!on_device_grad.defined() && expected.defined()) {
        EXPECT_EQ(expected.abs().max().item<double>(), 0.0);
        return;
      }
      if (on_device_grad.defined() && !expected.defined()) {
        EXPECT_EQ(on_device_grad.abs().max().item<double>(), 0.0);
        return;
      }
      close(on_device_grad, expected);
    };
    close_or_zero(std::get<0>(device_grads), expected_grads[0]);
    close_or_zero(std::get<1>(device_grads), expected_grads[1]);
    close(std::get<2>(device_grads), expected_grads[2]);
    close(std::get<3>(device_grads), expected_grads[3]);
    if (c.bias) close(std::get<4>(device_grads), expected_grads[4]);
  }
}

std::string backend_name(const ::testing::TestParamInfo<BackendKey>& info) { return key_name(info.param.key); }

// Every backend key, not only those registered when the tests are listed: CTest lists them once,
// and runs them again under CONVNN_CPU_KERNELS=generic, where the CPU key has no kernel and its test
// must show as skipped rather than vanish.
INSTANTIATE_TEST_SUITE_P(BackendKeys, RegisteredDeviceSweep, ::testing::ValuesIn(convnn::testing::backend_keys()),
                         backend_name);

}  // namespace
