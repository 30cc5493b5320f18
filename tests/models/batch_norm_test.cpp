// The models' BatchNorm2d: LibTorch's unless synchronised; synchronised, it normalises with the
// statistics summed over processes. Here a stand-in "all-reduce" doubles its input, as a second
// process holding the same batch would: output, input gradient (of both processes' losses) and
// running statistics must be those of LibTorch's batch norm over both batches in one process.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "convnn/models/batch_norm.h"
#include "support/assert_close.h"

namespace convnn::models {
namespace {

const AllReduceSum kSecondIdenticalProcess = [](const at::Tensor& t) { t.mul_(2); };

TEST(SyncBatchNorm, WithAnIdenticalSecondProcessItIsLibTorchsBatchNormOverBothBatches) {
  torch::manual_seed(3);
  const auto x = torch::randn({4, 3, 5, 5}, torch::kDouble);
  const auto weights = torch::randn({4, 3, 5, 5}, torch::kDouble);
  BatchNorm2d plain(3), synchronised(3);
  plain->to(torch::kDouble);
  synchronised->to(torch::kDouble);
  synchronised->synchronise(kSecondIdenticalProcess);
  // One process with both batches, the loss summed over both.
  const auto x_first = x.clone().requires_grad_();
  const auto y_both = plain(torch::cat({x_first, x}));
  (y_both * torch::cat({weights, weights})).sum().backward();
  // This process with its batch; the other process's loss reaches x through the statistics.
  const auto x_sync = x.clone().requires_grad_();
  const auto y_sync = synchronised(x_sync);
  (y_sync * weights).sum().backward();
  EXPECT_TRUE(testing::AllClose(y_sync, y_both.narrow(0, 0, 4), 1e-12, 1e-12));
  EXPECT_TRUE(testing::AllClose(x_sync.grad(), x_first.grad(), 1e-12, 1e-12));
  EXPECT_TRUE(testing::AllClose(synchronised->running_mean, plain->running_mean, 1e-12, 1e-12));
  EXPECT_TRUE(testing::AllClose(synchronised->running_var, plain->running_var, 1e-12, 1e-12));
  EXPECT_EQ(synchronised->num_batches_tracked.item<int64_t>(), 1);
}

TEST(SyncBatchNorm, CloneKeepsTheTypeInsideASequential) {
  torch::nn::Sequential sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 3, 1)), BatchNorm2d(3));
  auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(sequential->clone());
  ASSERT_TRUE(copy);
  ASSERT_NE(copy->ptr(1), nullptr);
  EXPECT_NE(std::dynamic_pointer_cast<BatchNorm2dImpl>(copy->ptr(1)), nullptr);
  const auto x = torch::randn({2, 2, 4, 4});
  EXPECT_TRUE(torch::equal(copy->forward(x), sequential->forward(x)));
}

}  // namespace
}  // namespace convnn::models
