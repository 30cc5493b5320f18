// Each call of a core op checks its inputs once (src/ops/op_signatures.h): the registered kernel
// runs the op's check and hands what it established to the body, and the bodies call one another
// directly, so neither the fused attention's backward steps nor the generic path's blocks check
// again. Counted with op::checks_on_this_thread, which every check of an op's inputs increments.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <functional>
#include <tuple>

#include "convnn/ops/knn_ops.h"
#include "ops/generic/generic.h"
#include "ops/op_signatures.h"

namespace {

namespace op = convnn::ops::op;
namespace generic = convnn::ops::generic;

// The checks of op inputs that `call` ran on this thread.
int64_t checks_in(const std::function<void()>& call) {
  const int64_t before = op::checks_on_this_thread;
  call();
  return op::checks_on_this_thread - before;
}

struct CheckedOnceOperands {
  explicit CheckedOnceOperands(const torch::TensorOptions& options = torch::kDouble) {
    torch::manual_seed(7);
    queries = torch::randn({2, 9, 4}, options);
    keys = torch::randn({2, 11, 4}, options);
    values = torch::randn({2, 11, 5}, options);
    kernel = torch::randn({5, 3}, options);
    bias = torch::randn({5}, options);
  }
  torch::Tensor queries, keys, values, kernel, bias;
  static constexpr int64_t kK = 3;
};

// Shrinks the generic path's block budget so that every call runs in many blocks; restores it after.
class ManyGenericBlocks {
 public:
  ManyGenericBlocks() : saved_(generic::block_bytes()) { generic::set_block_bytes(512); }
  ~ManyGenericBlocks() { generic::set_block_bytes(saved_); }
  ManyGenericBlocks(const ManyGenericBlocks&) = delete;
  ManyGenericBlocks& operator=(const ManyGenericBlocks&) = delete;

 private:
  int64_t saved_;
};

}  // namespace

TEST(ChecksOncePerCall, EachOpThroughTheDispatcherChecksItsInputsOnce) {
  const CheckedOnceOperands in;
  // Named tensors, not a structured binding: C++17 lambdas cannot capture those (Clang refuses).
  torch::Tensor scores, indices;
  std::tie(scores, indices) = convnn::ops::knn_select(in.queries, in.keys, in.kK, "cosine", c10::nullopt, false);
  const auto weights = torch::softmax(scores, -1);
  const auto grad_output = torch::randn({2, 9, 5}, torch::kDouble);
  namespace ops = convnn::ops;
  for (const char* rho : {"softmax", "uniform"}) {
    SCOPED_TRACE(rho);
    EXPECT_EQ(checks_in([&] { ops::knn_select(in.queries, in.keys, in.kK, "chebyshev", c10::nullopt, true); }), 1);
    EXPECT_EQ(checks_in([&] { ops::knn_select_backward(weights, in.queries, in.keys, indices, scores, "cosine"); }), 1);
    EXPECT_EQ(checks_in([&] { ops::knn_aggregate(in.values, weights, indices, in.kernel, in.bias); }), 1);
    EXPECT_EQ(checks_in([&] {
                ops::knn_aggregate_backward(grad_output, in.values, weights, indices, in.kernel,
                                            {true, true, true, true});
              }),
              1);
    EXPECT_EQ(checks_in([&] {
                ops::knn_attention(in.queries, in.keys, in.values, in.kernel, in.bias, in.kK, "cosine", c10::nullopt,
                                   false, rho, 0.5);
              }),
              1);
    EXPECT_EQ(checks_in([&] {
                ops::knn_attention_backward(grad_output, in.queries, in.keys, in.values, in.kernel, scores, indices,
                                            weights, "cosine", rho, 0.5, {true, true, true, true, true});
              }),
              1);
  }
}

TEST(ChecksOncePerCall, TheGenericPathChecksOnceHoweverManyBlocksACallRunsIn) {
  const CheckedOnceOperands in;
  const ManyGenericBlocks blocks;
  torch::Tensor output, scores, indices, weights;
  std::tie(output, scores, indices, weights) = generic::knn_attention(
      in.queries, in.keys, in.values, in.kernel, in.bias, in.kK, "dot", c10::nullopt, false, "softmax", 0.5);
  const auto grad_output = torch::randn_like(output);
  EXPECT_EQ(checks_in([&] {
              generic::knn_attention(in.queries, in.keys, in.values, in.kernel, in.bias, in.kK, "dot", c10::nullopt,
                                     false, "softmax", 0.5);
            }),
            1);
  EXPECT_EQ(checks_in([&] {
              generic::knn_attention_backward(grad_output, in.queries, in.keys, in.values, in.kernel, scores, indices,
                                              weights, "dot", "softmax", 0.5, {true, true, true, true, true});
            }),
            1);
  EXPECT_EQ(checks_in([&] { generic::knn_select_backward(weights, in.queries, in.keys, indices, scores, "dot"); }), 1);
  EXPECT_EQ(checks_in([&] {
              generic::knn_aggregate_backward(grad_output, in.values, weights, indices, in.kernel,
                                              {true, true, true, true});
            }),
            1);
}

TEST(ChecksOncePerCall, ATrainingStepThroughAutogradChecksTheForwardOnceAndTheBackwardOnce) {
  CheckedOnceOperands in;
  for (auto* t : {&in.queries, &in.keys, &in.values, &in.kernel, &in.bias}) t->requires_grad_(true);
  torch::Tensor output;
  EXPECT_EQ(checks_in([&] {
              output = std::get<0>(convnn::ops::knn_attention(in.queries, in.keys, in.values, in.kernel, in.bias,
                                                              in.kK, "scaled_dot", c10::nullopt, false, "softmax",
                                                              1.0));
            }),
            1);
  // CPU-only graphs run their backward on the calling thread, so its checks are counted here too.
  EXPECT_EQ(checks_in([&] { output.pow(2).sum().backward(); }), 1);
  EXPECT_TRUE(in.queries.grad().defined());
  EXPECT_TRUE(in.kernel.grad().defined());
}

TEST(ChecksOncePerCall, MetaTensorsAreCheckedOnceByShapesOnly) {
  const CheckedOnceOperands in(torch::TensorOptions().dtype(torch::kFloat).device(torch::kMeta));
  EXPECT_EQ(checks_in([&] {
              convnn::ops::knn_attention(in.queries, in.keys, in.values, in.kernel, in.bias, in.kK, "l1",
                                         c10::nullopt, false, "softmax", 1.0);
            }),
            1);
}

TEST(ChecksOncePerCall, ABadInputIsStillRefusedByTheCheckWithItsName) {
  const CheckedOnceOperands in;
  EXPECT_THROW(
      {
        try {
          convnn::ops::knn_attention(in.queries, in.keys, in.values, in.kernel, in.bias, 12, "dot", c10::nullopt,
                                     false, "softmax", 1.0);
        } catch (const c10::Error& error) {
          EXPECT_NE(std::string(error.what()).find("knn_attention: k"), std::string::npos) << error.what();
          throw;
        }
      },
      c10::Error);
}
