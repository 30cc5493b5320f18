#pragma once
// Checkpoints: the model, the optimiser, the position in training (epoch, next batch, optimiser
// step), the partial-epoch accumulators, the RNG state and the run's config, in one file written
// atomically (temporary file in the same directory, synced, then renamed), so a crash or a power
// cut never leaves a truncated checkpoint in place of a finished one.
//
// The file is a torch.save file (format 4) of plain data only, which Python reads whole with
// torch.load(path, weights_only=True): a dict with "state_dict" (the model's tensors, under the
// names the Python package's models have too), "config", "position", "optimizer" (laid out as
// torch.optim's state_dict(), which torch.optim.AdamW and SGD load) and "rng_cpu". A CRC-32 of every
// record is kept, because torch's zip reader does not check the archive's own: a flipped byte in a
// tensor would otherwise load as a wrong weight.
//
// Files from strangers: reading a checkpoint runs nothing named in it (a restricted reader takes
// only dicts, lists, tuples, strings, numbers and tensors, nested at most 64 deep, without cycles,
// no record larger than the file), and every value is checked before it is used: tensors against
// the model's names, shapes and dtypes, the optimiser state against the parameters, the config by
// its rules, the position against the config. Checkpoints of convnn's formats 1 and 2 (TorchScript
// archives) and format 3's optimiser record (libtorch's optimiser archive, also TorchScript) can run
// code when opened: they are refused unless the caller trusts them (LegacyFiles::Trust, which only
// `convnn checkpoint convert --trust-legacy` passes); format 3's weights still load without it.
//
// Loading also accepts weights alone: a state_dict saved by Python (torch.save(model.state_dict(),
// path), also under a dict's "state_dict" key, also from a model wrapped by DDP or torch.compile).
//
// Every tensor is stored on the CPU, whatever device trained the model, and loaded onto the device
// of the model it is loaded into: a checkpoint written on one device resumes on another.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>

#include "convnn/checkpoint/atomic_file.h"
#include "convnn/config/train_config.h"

namespace convnn::checkpoint {

using train::TrainConfig;

/// Everything one epoch of training accumulates: what the training loop sums batch by batch, and
/// what a checkpoint written within an epoch stores, so that a resumed epoch reports what an
/// uninterrupted one would.
struct EpochTotals {
  double loss_sum = 0.0;
  int64_t samples = 0;
  int64_t correct = 0;
  double seconds = 0.0;
  int64_t skipped = 0;  // unreadable training files left out so far in this epoch
};

struct TrainingPosition {
  int64_t epoch = 0;        // epoch in progress (0-based)
  int64_t next_batch = 0;   // first batch of `epoch` not yet trained; 0 at an epoch boundary
  int64_t step = 0;         // optimiser steps done
  double best_top1 = -1.0;  // best validation top-1 so far (percent); -1: none yet
  int64_t best_epoch = -1;
  EpochTotals totals;       // of the epoch in progress (zero at an epoch boundary)
};

struct Checkpoint {
  TrainConfig config;
  TrainingPosition position;
};

/// Whether a TorchScript archive (formats 1 and 2, format 3's optimiser record) may be opened.
/// Opening one runs the code it may contain: Trust is for files from a trusted source only.
enum class LegacyFiles { Refuse, Trust };

/// Writes `path` atomically (write_file_atomically), the model's tensors and the optimiser's state
/// copied to the CPU (the live state stays where it is). Also removes the stale temporary files of
/// the other checkpoints in its folder (`.<name>.pt.tmp<pid>` of dead processes), so that one left
/// by a kill while checkpoint-best.pt was written does not wait for the next best epoch.
void save_checkpoint(const std::string& path, const TrainConfig& config,
                     const TrainingPosition& position, torch::nn::Module& model,
                     torch::optim::Optimizer& optimizer);

/// Reads only the config and the position (to build the model and the optimiser first), both
/// checked by their rules. A file of weights alone is an error saying how such a file is used.
Checkpoint read_checkpoint_header(const std::string& path, LegacyFiles legacy = LegacyFiles::Refuse);

/// True when `path` is a checkpoint of a run (it has a config and a position); false when it holds
/// weights alone. Errors as read_checkpoint_header for missing, unreadable or damaged files.
bool holds_run(const std::string& path, LegacyFiles legacy = LegacyFiles::Refuse);

/// Loads the weights (and, when `optimizer` is not null, the optimiser state and the RNG state,
/// which a file of weights alone does not have) into objects built from the checkpoint's config:
/// the weights onto the model's device, by name, each parameter's optimiser state onto that
/// parameter's device. Every check runs before anything is changed; each failure is a c10::Error
/// naming the path and the first offending record:
/// - the file is missing, is not a zip archive, or is truncated;
/// - a record's checksum does not match (the file was damaged after it was written);
/// - the tensors do not match the model (the first of the model's tensors the file lacks or holds
///   with another shape or dtype, else the first the file holds that the model lacks);
/// - the optimiser state does not match the optimiser (its groups, parameters, shapes, dtypes);
/// - a model tensor (or, when loading it, an optimiser state tensor) holds NaN or Inf, unless
///   `allow_non_finite` (a diverged run's weights evaluate to chance with a NaN loss);
/// - the file is a TorchScript archive, or (with an optimiser) of format 3, and `legacy` is Refuse.
/// Without an optimiser, the optimiser record is not interpreted (its checksum is checked).
void load_checkpoint(const std::string& path, torch::nn::Module& model,
                     torch::optim::Optimizer* optimizer, bool allow_non_finite = false,
                     LegacyFiles legacy = LegacyFiles::Refuse);

namespace detail {
struct CheckpointRecords;
}

/// A run to continue where it stopped (`--resume`): its checkpoint opened, and every record read
/// and checked, once (checksums; the config and the position by their rules, as
/// read_checkpoint_header; the errors of load_checkpoint). load_into then puts the weights, the
/// optimiser state and the RNG state into the model and the optimiser built from config(),
/// checked against them whole before anything changes, and lets the records go (they are a copy
/// of the model and its optimiser state): it loads once.
class Resumption {
 public:
  explicit Resumption(const std::string& path, LegacyFiles legacy = LegacyFiles::Refuse);
  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] const TrainConfig& config() const { return run_.config; }
  [[nodiscard]] const TrainingPosition& position() const { return run_.position; }
  void load_into(torch::nn::Module& model, torch::optim::Optimizer& optimizer, bool allow_non_finite);

 private:
  std::string path_;
  Checkpoint run_;
  std::shared_ptr<const detail::CheckpointRecords> records_;
};

/// A run's checkpoints in its folder, written as its training loop reaches them (as timm's
/// CheckpointSaver): checkpoint-latest.pt at every epoch's end and at a stop, checkpoint-best.pt
/// at the end of an epoch that is the best so far. The loop owns one; nothing else needs the loop.
class CheckpointSaver {
 public:
  explicit CheckpointSaver(std::string run_dir);
  /// A stop within an epoch: the latest checkpoint holds `position`.
  void stopped(const TrainConfig& config, const TrainingPosition& position, torch::nn::Module& model,
               torch::optim::Optimizer& optimizer) const;
  /// An epoch's end: the latest checkpoint holds `next` (the next epoch's start), and the best one
  /// too when `best`.
  void epoch_done(const TrainConfig& config, const TrainingPosition& next, torch::nn::Module& model,
                  torch::optim::Optimizer& optimizer, bool best) const;
  [[nodiscard]] std::string latest() const;
  [[nodiscard]] std::string best() const;

 private:
  std::string run_dir_;
};

/// `dir`/checkpoint-latest.pt and `dir`/checkpoint-best.pt.
std::string latest_checkpoint_path(const std::string& run_dir);
std::string best_checkpoint_path(const std::string& run_dir);


}  // namespace convnn::checkpoint
