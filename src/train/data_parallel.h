#pragma once
// Data parallelism beside the training loop: what the loop asks of the other processes, in its own
// words (agree to stop, average gradients, sum the totals, wait for rank 0's files). With no group
// (a single process) every call does nothing or returns what it was given, so the loop has no
// branch of its own on whether it runs alone.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "convnn/checkpoint/checkpoint.h"
#include "convnn/dist/process_group.h"
#include "convnn/models/registry.h"
#include "convnn/train/trainer.h"

namespace convnn::train {

class DataParallel {
 public:
  /// Over `group`'s processes; none (nullptr): a single process.
  explicit DataParallel(dist::ProcessGroup* group) : group_(group) {}

  /// Rank 0, or a single process: the one that logs and writes files.
  bool is_main() const { return group_ == nullptr || group_->is_main(); }
  /// Whether the group (if any) can train with an empty batch on this process: no, every rank
  /// takes part in each synchronised backward.
  bool can_skip_a_batch() const { return group_ == nullptr; }
  /// "rank r of n" for errors (empty for a single process).
  std::string rank_name() const;

  /// Rank 0's parameters and buffers on every rank (every rank built the same model from the same
  /// seed, or loaded the same checkpoint: this makes it so whatever happened), batch norm
  /// synchronised across ranks if asked, then DDP's reducer over the trained parameters.
  void join(models::Model& model, bool sync_batch_norm);

  /// Around each micro-batch: DDP's bookkeeping before the forward and before the backward, and
  /// the backward itself, which all-reduces gradients when `synchronise`. A peer that died or
  /// stopped answering surfaces in the backward, as Gloo's or NCCL's error, which this names.
  void before_forward(bool synchronise);
  void before_backward();
  void backward(const at::Tensor& loss, bool synchronise);

  /// Whether any rank asked to stop (`here`: this one did): all stop at the same step.
  bool any_stops(bool here);

  /// An epoch's training totals over every rank: sums, and the slowest rank's time.
  checkpoint::EpochTotals sum(const checkpoint::EpochTotals& totals);
  /// The evaluation counts of every rank's shard, summed exactly (integers; the loss in float64).
  void sum(Evaluation& e, double& loss_sum, int64_t& top1, int64_t& top5);

  /// Waits until rank 0 wrote its files (checkpoints) before any rank goes on.
  void wait_for_main_writes();

 private:
  dist::ProcessGroup* group_;
  std::unique_ptr<dist::GradientReducer> reducer_;
};

}  // namespace convnn::train
