#include "train/data_parallel.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <vector>

#include "convnn/models/batch_norm.h"

namespace convnn::train {

using checkpoint::EpochTotals;

std::string DataParallel::rank_name() const {
  return group_ == nullptr ? std::string() : fmt::format("rank {} of {}", group_->rank(), group_->world_size());
}

void DataParallel::join(models::Model& model, bool sync_batch_norm) {
  if (group_ == nullptr) return;
  std::vector<at::Tensor> state;
  for (const auto& p : model.module()->parameters()) state.push_back(p.detach());
  for (const auto& b : model.module()->buffers()) state.push_back(b.detach());
  group_->broadcast_from_main(state);
  if (sync_batch_norm) {
    models::synchronise_batch_norms(*model.module(), [group = group_](const at::Tensor& t) { group->all_reduce_sum(t); });
  }
  std::vector<at::Tensor> trained;
  for (const auto& p : model.module()->parameters()) {
    if (p.requires_grad()) trained.push_back(p);
  }
  reducer_ = group_->gradient_reducer(trained);
}

void DataParallel::before_forward(bool synchronise) {
  if (reducer_) reducer_->before_forward(synchronise);
}

void DataParallel::before_backward() {
  if (reducer_) reducer_->before_backward();
}

void DataParallel::backward(const at::Tensor& loss, bool synchronise) {
  if (!reducer_ || !synchronise) return loss.backward();
  try {
    loss.backward();
  } catch (const std::exception& e) {
    const auto* error = dynamic_cast<const c10::Error*>(&e);
    TORCH_CHECK(false, rank_name(), ": backward with the gradient all-reduce failed: ", error ? error->msg() : e.what(),
                " (another process of the group died, or did not answer within --dist-timeout)");
  }
}

bool DataParallel::any_stops(bool here) {
  if (group_ == nullptr) return here;
  auto flag = at::full({1}, here ? 1 : 0, at::kLong);
  group_->all_reduce_max(flag);
  return flag.item<int64_t>() != 0;
}

EpochTotals DataParallel::sum(const EpochTotals& t) {
  if (group_ == nullptr) return t;
  auto counts = at::tensor({t.samples, t.correct, t.skipped}, at::kLong);
  auto sums = at::tensor({t.loss_sum}, at::kDouble);
  auto seconds = at::tensor({t.seconds}, at::kDouble);
  group_->all_reduce_sum(counts);
  group_->all_reduce_sum(sums);
  group_->all_reduce_max(seconds);
  const auto* c = counts.data_ptr<int64_t>();
  return {sums.item<double>(), c[0], c[1], seconds.item<double>(), c[2]};
}

void DataParallel::sum(Evaluation& e, double& loss_sum, int64_t& top1, int64_t& top5) {
  if (group_ == nullptr) return;
  const auto classes = static_cast<int64_t>(e.confusion.size());
  auto counts = at::empty({4 + classes * classes}, at::kLong);
  auto* c = counts.data_ptr<int64_t>();
  c[0] = e.samples, c[1] = top1, c[2] = top5, c[3] = e.skipped;
  for (int64_t t = 0; t < classes; ++t) {
    for (int64_t q = 0; q < classes; ++q) c[4 + t * classes + q] = e.confusion[t][q];
  }
  group_->all_reduce_sum(counts);
  e.samples = c[0], top1 = c[1], top5 = c[2], e.skipped = c[3];
  for (int64_t t = 0; t < classes; ++t) {
    for (int64_t q = 0; q < classes; ++q) e.confusion[t][q] = c[4 + t * classes + q];
  }
  auto loss = at::full({1}, loss_sum, at::kDouble);
  group_->all_reduce_sum(loss);
  loss_sum = loss.item<double>();
}

void DataParallel::wait_for_main_writes() {
  if (group_ != nullptr) group_->barrier();
}

}  // namespace convnn::train
