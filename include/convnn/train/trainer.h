#pragma once
// The training loop and evaluation behind `convnn train`, `convnn eval` and `convnn compare`.
//
// The device (cpu, cuda:0, ...) is a run-time choice, not part of TrainConfig: a run resumes
// exactly on the device it was written on and continues on any other. Models are initialised on
// the CPU and then moved, so a seed gives the same starting weights everywhere; the loader always
// builds CPU batches (pinned for CUDA) that are copied to the device without blocking; checkpoints
// hold CPU tensors and load onto the run's device. Bitwise-exact resume is a CPU property: an
// accelerator's kernels and random generator (dropout, random candidates) are not checkpointed.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "convnn/data/image_folder_source.h"
#include "convnn/data/loader.h"
#include "convnn/models/registry.h"
#include "convnn/config/train_config.h"
#include "convnn/train/data_setup.h"
#include "convnn/train/metrics.h"
#include "convnn/train/sinks.h"

namespace convnn::dist {
class ProcessGroup;
}
namespace convnn::checkpoint {
class Resumption;
}

namespace convnn::train {

struct Evaluation {
  double loss = 0.0;  // cross-entropy without smoothing
  double top1 = 0.0;  // percent
  double top5 = 0.0;  // percent
  int64_t samples = 0;
  int64_t skipped = 0;  // unreadable files left out
  std::vector<std::string> class_names;
  std::vector<std::vector<int64_t>> confusion;  // [true][predicted]
};

/// Runs `model` in eval mode over one pass of `loader`, on the device of the model's parameters.
/// With `group`, each rank passes its shard of the data (a loader from make_loader with the group)
/// and every rank gets the counts of all shards summed, exactly.
Evaluation evaluate(models::Model& model, data::BatchStream& loader, Precision precision,
                    dist::ProcessGroup* group = nullptr);

struct TrainResult {
  std::string run_dir;
  std::vector<EpochMetrics> epochs;
  Evaluation final_eval;          // of the last epoch's model on the validation set
  double best_top1 = 0.0;
  int64_t best_epoch = 0;         // 1-based
  int64_t parameters = 0;
  int64_t macs = 0;               // per image
  bool interrupted = false;       // stopped by `stop` (SIGINT); checkpoint-latest.pt holds the position
};

struct TrainHooks {
  /// Checked after every optimiser step; when set, training saves checkpoint-latest.pt and returns.
  const std::atomic<bool>* stop = nullptr;
  /// Stop after this many optimiser steps in this call, as if interrupted (tests); 0: never.
  int64_t max_steps = 0;
  /// Told of the run's progress (rank 0 only, but for skipped samples); not owned. None: the run
  /// is silent (skipped samples are still counted in the epoch's metrics).
  std::vector<TrainingSink*> sinks;
};

/// Trains as `config` says, in `run_dir`; with `resume`, continues from that checkpoint file (its
/// run directory is reused; `allow_non_finite` as in load_checkpoint), whatever device wrote it.
/// The model, loss, metrics and optimiser run on `device`, which must be the CPU or an
/// accelerator present in this process (c10::Error naming it otherwise, before any file is
/// written). Reports its progress to hooks.sinks; prints nothing itself.
///
/// With `group` (data parallelism; every rank calls this with the same config): each rank trains
/// on its shard of every epoch (shard_order: the same global order for any world size) with its
/// batch of config.optimization.batch_size, DDP's reducer averages the gradients (accumulation steps
/// accumulate locally), the epoch's metrics and the evaluation are summed over the ranks, and
/// rank 0 alone prints, writes config.json, metrics, plots and checkpoints, which every rank waits
/// for. A stop on any rank stops all at the same step. A run stopped within an epoch resumes with
/// the same number of processes; one stopped at an epoch's end, with any.
TrainResult train(const TrainConfig& config, const std::string& resume = "",
                  const TrainHooks& hooks = {}, bool allow_non_finite = false,
                  const c10::Device& device = c10::Device(c10::kCPU), dist::ProcessGroup* group = nullptr);
/// The same, continuing the run that `resumed` opened (the command line opens it once: it reads the
/// run's config from it too), whose records it loads (Resumption::load_into: once).
TrainResult train(const TrainConfig& config, checkpoint::Resumption& resumed, const TrainHooks& hooks = {},
                  bool allow_non_finite = false, const c10::Device& device = c10::Device(c10::kCPU),
                  dist::ProcessGroup* group = nullptr);

/// The config's model, initialised on the CPU from torch's global generator (a seed gives the same
/// weights on every device) and then moved to `device`: the CPU or an accelerator present in this
/// process (c10::Error naming the device otherwise).
models::Model make_model(const TrainConfig& config, const c10::Device& device);

/// Rewrites the checkpoint of a run at `from` (any format, TorchScript archives included, which this
/// opens: for files from a trusted source only) as a format-4 checkpoint at `to`, with the same
/// weights, optimiser state, RNG state, config and position, so that a run resumes from `to`
/// exactly as it would have from `from`. `to` must not exist.
void convert_checkpoint(const std::string& from, const std::string& to);

/// Evaluates the model of `checkpoint` on `split` of the data `config` names (the checkpoint's
/// config, possibly with another data_dir, batch size or workers), without augmentation. For a
/// file of weights alone (a state_dict saved by Python), `config` names the model, and its
/// classes, channels and image size come from the data, as in training.
/// A data set that does not fit the model (classes, channels, size) is an error; so are NaN or
/// Inf weights unless `allow_non_finite` (load_checkpoint). The model is loaded onto `device` (as
/// in train) and evaluated there. `on_skipped_sample` is told why each unreadable sample was left
/// out (its file and the error; data::LoaderOptions::on_skipped); Evaluation::skipped counts them
/// either way.
Evaluation evaluate_checkpoint(const std::string& checkpoint, const TrainConfig& config, data::Split split,
                               Precision precision, bool allow_non_finite = false,
                               const c10::Device& device = c10::Device(c10::kCPU),
                               const std::function<void(const std::string&)>& on_skipped_sample = {});

}  // namespace convnn::train
