#include "convnn/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <torch/nn/utils/clip_grad.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <limits>
#include <string_view>
#include <nlohmann/json.hpp>

#include "convnn/dist/process_group.h"
#include "convnn/checkpoint/checkpoint.h"
#include "convnn/train/loss.h"
#include "convnn/train/optim.h"
#include "convnn/train/schedule.h"
#include "convnn/util/device.h"
#include "convnn/train/sinks.h"
#include "train/data_parallel.h"

namespace convnn::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using checkpoint::holds_run;
using checkpoint::latest_checkpoint_path;
using checkpoint::load_checkpoint;
using checkpoint::Resumption;
using checkpoint::EpochTotals;
using checkpoint::TrainingPosition;
using checkpoint::write_file_atomically;

// The loader's report of a skipped sample, told to every sink, on every rank (each reads the files
// of its own shard). None without sinks: the epoch's metrics still count it.
std::function<void(const std::string&)> skip_reporter(const TrainHooks& hooks) {
  if (hooks.sinks.empty()) return {};
  return [sinks = hooks.sinks](const std::string& reason) {
    for (auto* sink : sinks) sink->sample_skipped(reason);
  };
}

// bfloat16 autocast on the model's device type for the guard's lifetime (no-op for float32).
class AutocastGuard {
 public:
  AutocastGuard(Precision precision, c10::DeviceType device)
      : enabled_(precision == Precision::BFloat16), device_(device) {
    if (!enabled_) return;
    previous_ = at::autocast::is_autocast_enabled(device_);
    previous_dtype_ = at::autocast::get_autocast_dtype(device_);
    at::autocast::set_autocast_enabled(device_, true);
    at::autocast::set_autocast_dtype(device_, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_, previous_);
    at::autocast::set_autocast_dtype(device_, previous_dtype_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool enabled_;
  c10::DeviceType device_;
  bool previous_ = false;
  at::ScalarType previous_dtype_ = at::kBFloat16;
};

// The CPU or an accelerator this process has: the rule of `--device`. (Not meta: a checkpoint
// needs values, and Module::to cannot move parameters there.)
void check_device(const c10::Device& device, std::string_view argument) {
  resolve_device(device_name(device), argument);  // throws when the device is not present
}

// Where a model's parameters live, and their type: the device and type of its inputs.
at::TensorOptions inputs_of(models::Model& model) {
  const auto parameters = model.module()->parameters();
  if (parameters.empty()) return at::TensorOptions().dtype(at::kFloat);
  return at::TensorOptions().device(parameters.front().device()).dtype(parameters.front().scalar_type());
}

// A loader's batch on the model's device. The copies are non-blocking: from pinned memory they
// overlap the device's work; on the CPU they are no copies at all.
struct DeviceBatch {
  at::Tensor inputs, labels, targets;
};

// Images and soft targets take the model's floating type (float64 with --precision float64); tokens
// and labels stay integers.
DeviceBatch to_device(const data::Batch& batch, const at::TensorOptions& model) {
  const auto move = [&](const at::Tensor& t) {
    if (!t.defined()) return t;
    const auto type = t.is_floating_point() ? model.dtype().toScalarType() : t.scalar_type();
    return t.to(model.device(), type, /*non_blocking=*/true);
  };
  return {move(batch.inputs), move(batch.labels), move(batch.targets)};
}

// A language model predicts every position: its logits [B,T,V] and labels [B,T] become the rows of
// a classification, [B*T, V] and [B*T]. An image model's [B,C] and [B] pass as they are.
std::pair<at::Tensor, at::Tensor> prediction_rows(const at::Tensor& logits, const at::Tensor& labels) {
  if (logits.dim() == 2) return {logits, labels};
  return {logits.flatten(0, -2), labels.flatten()};
}

std::string default_experiment(const TrainConfig& c) {
  const auto now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", std::localtime(&now));
  return fmt::format("{}-{}-{}", c.model, c.data.dataset, stamp);
}

void write_config(const std::string& run_dir, const TrainConfig& config) {
  write_file_atomically((fs::path(run_dir) / "config.json").string(),
                        nlohmann::json(config).dump(2) + "\n");
}

// The evaluation of this process's shard of `loader`, summed over the ranks.
Evaluation evaluate_shards(models::Model& model, data::BatchStream& loader, Precision precision,
                           DataParallel& parallel) {
  at::NoGradGuard no_grad;
  model.module()->eval();
  const auto inputs = inputs_of(model);
  const auto device = inputs.device();
  const int64_t classes = loader.num_classes();
  Evaluation e;
  e.class_names = loader.class_names();
  e.confusion.assign(classes, std::vector<int64_t>(classes, 0));
  double loss_sum = 0.0;
  int64_t top1 = 0, top5 = 0;
  loader.start_epoch(0);
  while (auto batch = loader.next()) {
    if (batch->labels.numel() == 0) continue;  // every file of the batch was unreadable
    const auto on_device = to_device(*batch, inputs);
    at::Tensor logits;
    {
      AutocastGuard autocast(precision, device.type());
      logits = model.forward(on_device.inputs);
    }
    at::Tensor labels;
    std::tie(logits, labels) = prediction_rows(logits, on_device.labels);
    if (logits.scalar_type() != at::kDouble) logits = logits.to(at::kFloat);  // bfloat16 under autocast
    loss_sum += at::cross_entropy_loss(logits, labels, {}, at::Reduction::Sum).item<double>();
    top1 += correct_top_k(logits, labels, 1);
    top5 += correct_top_k(logits, labels, 5);
    const auto predicted = logits.argmax(1).cpu().contiguous();
    const auto truth = labels.cpu().contiguous();
    const auto* p = predicted.const_data_ptr<int64_t>();
    const auto* t = truth.const_data_ptr<int64_t>();
    for (int64_t i = 0; i < predicted.size(0); ++i) ++e.confusion[t[i]][p[i]];
    e.samples += predicted.size(0);
  }
  e.skipped = loader.skipped();
  parallel.sum(e, loss_sum, top1, top5);
  const double n = static_cast<double>(std::max<int64_t>(1, e.samples));
  e.loss = loss_sum / n;
  e.top1 = 100.0 * top1 / n;
  e.top5 = 100.0 * top5 / n;
  return e;
}

class Trainer {
 public:
  Trainer(TrainConfig config, SplitData train_data, std::string run_dir, TrainingPosition position,
          const TrainHooks& hooks, Resumption* resumed, bool allow_non_finite,
          const c10::Device& device, dist::ProcessGroup* group)
      : config_(std::move(config)),
        run_dir_(std::move(run_dir)),
        position_(position),
        hooks_(hooks),
        device_(device),
        parallel_(group),
        train_loader_(
            make_batches(std::move(train_data), config_, true, device_, group, skip_reporter(hooks))),
        val_loader_(make_batches(load_split(config_, data::Split::Test), config_, false, device_, group,
                                skip_reporter(hooks))),
        // Before the optimiser, which then holds (and keeps its state beside) the moved parameters.
        model_(make_model(config_, device_)),
        optimizer_(make_optimizer(config_.optimization, *model_.module())),
        schedule_(LrSchedule::from_config(config_.optimization, steps_per_epoch())),
        metrics_(run_dir_, position_.epoch + 1) {
    if (resumed != nullptr) {
      check_position_fits_data(resumed->path());
      resumed->load_into(*model_.module(), *optimizer_, allow_non_finite);
    } else if (!config_.run.initial_checkpoint.empty()) {
      load_checkpoint(config_.run.initial_checkpoint, *model_.module(), nullptr, allow_non_finite);
    }
    parallel_.join(model_, config_.run.sync_bn);
  }

  TrainResult run() {
    report([&](TrainingSink& s) { s.run_started(run_dir_); });
    TrainResult result;
    result.run_dir = run_dir_;
    result.parameters = model_.parameter_count();
    result.macs = model_.cost().total().macs;
    int64_t steps_this_call = 0;
    for (; position_.epoch < config_.optimization.epochs; ++position_.epoch) {
      if (!train_epoch(steps_this_call)) {
        result.interrupted = true;
        break;
      }
      result.final_eval = end_epoch();
    }
    result.epochs = metrics_.epochs();
    result.best_top1 = position_.best_top1;
    result.best_epoch = position_.best_epoch + 1;
    return result;
  }

 private:
  // The parts of a stored position the data decides (Resumption checked the rest): the
  // next batch is within the epoch (equal to its batch count when a stop came after its last batch,
  // before its evaluation), and no more steps were taken than the epochs allow.
  void check_position_fits_data(const std::string& path) const {
    const auto batches = train_loader_->batches_per_epoch();
    TORCH_CHECK(position_.next_batch <= batches, "checkpoint '", path, "' is damaged or of another data set: its "
                "position's next_batch ", position_.next_batch, " is past the epoch's ", batches, " batches");
    const auto most_steps = (position_.epoch + 1) * steps_per_epoch();
    TORCH_CHECK(position_.step <= most_steps, "checkpoint '", path, "' is damaged: its position's step ",
                position_.step, " is more than the ", most_steps, " steps of ", position_.epoch + 1, " epochs");
  }

  int64_t steps_per_epoch() const {
    return (train_loader_->batches_per_epoch() + config_.optimization.accum_steps - 1) /
           config_.optimization.accum_steps;
  }

  // Returns false when stopped (checkpoint-latest.pt then holds the position).
  bool train_epoch(int64_t& steps_this_call) {
    model_.module()->train();
    const int64_t batches = train_loader_->batches_per_epoch();
    train_loader_->start_epoch(position_.epoch, position_.next_batch);
    report([&](TrainingSink& s) {
      s.epoch_started(position_.epoch + 1, config_.optimization.epochs, batches, position_.next_batch);
    });
    EpochTotals totals = position_.totals;
    const int64_t skipped_before = position_.totals.skipped;  // before a resumed epoch's first batch
    int64_t images_this_call = 0;
    const auto start = Clock::now();
    while (auto batch = train_loader_->next()) {
      const int64_t group_start =
          batch->index / config_.optimization.accum_steps * config_.optimization.accum_steps;
      const int64_t group_size = std::min(config_.optimization.accum_steps, batches - group_start);
      const double lr = schedule_.at(position_.step);
      set_lr(*optimizer_, lr);
      totals.skipped = skipped_before + train_loader_->skipped();
      // A batch can be empty when all its files were unreadable: nothing to learn from. Its samples
      // are its labels: images, or the tokens a language model predicts.
      const int64_t b = batch->labels.numel();
      const bool step_now = batch->index + 1 == group_start + group_size;
      TORCH_CHECK(b > 0 || parallel_.can_skip_a_batch(), parallel_.rank_name(), ": every file of batch ",
                  batch->index + 1, " of epoch ", position_.epoch + 1,
                  " is unreadable, and a data-parallel run cannot skip a whole batch (see the warnings)");
      if (b > 0) {
        // Not a structured binding: the lambda below captures loss (C++17 forbids that; Clang refuses).
        double loss = 0;
        int64_t correct = 0;
        std::tie(loss, correct) = forward_backward(*batch, group_size, step_now);
        totals.loss_sum += loss * b;
        totals.samples += b;
        totals.correct += correct;
        images_this_call += b;
        report([&](TrainingSink& s) { s.batch_loss(position_.step, loss); });
      }
      if (step_now) optimizer_step();
      const double mean_loss = totals.loss_sum / std::max<int64_t>(1, totals.samples);
      report([&](TrainingSink& s) { s.batch_done(batch->index, images_this_call, mean_loss, lr); });
      if (step_now && (++steps_this_call == hooks_.max_steps || stop_requested())) {
        report([](TrainingSink& s) { s.epoch_trained(); });
        totals.seconds += std::chrono::duration<double>(Clock::now() - start).count();
        save_position(batch->index + 1, totals);
        report([&](TrainingSink& s) {
          s.stopped(position_.epoch + 1, batch->index + 1, saver_.latest());
        });
        return false;
      }
    }
    report([](TrainingSink& s) { s.epoch_trained(); });
    totals.seconds += std::chrono::duration<double>(Clock::now() - start).count();
    epoch_totals_ = totals;
    return true;
  }

  // The caller's sinks, on rank 0 only.
  template <typename Call>
  void report(Call&& call) {
    if (!parallel_.is_main()) return;
    for (auto* sink : hooks_.sinks) call(*sink);
  }

  // A stop asked of any rank stops all of them at the same step.
  bool stop_requested() { return parallel_.any_stops(hooks_.stop != nullptr && hooks_.stop->load()); }

  std::pair<double, int64_t> forward_backward(const data::Batch& loaded, int64_t group_size, bool synchronise) {
    const auto batch = to_device(loaded, inputs_of(model_));
    parallel_.before_forward(synchronise);
    at::Tensor logits;
    {
      AutocastGuard autocast(config_.optimization.precision, device_.type());
      logits = model_.forward(batch.inputs);
    }
    at::Tensor labels;
    std::tie(logits, labels) = prediction_rows(logits, batch.labels);
    // MixUp / CutMix targets come smoothed already.
    const auto targets = batch.targets.defined()
                             ? batch.targets
                             : smooth_targets(labels, logits.size(1), config_.optimization.smoothing);
    const auto loss = soft_target_cross_entropy(logits, targets);
    parallel_.before_backward();
    parallel_.backward(loss / static_cast<double>(group_size), synchronise);
    const double value = loss.item<double>();
    TORCH_CHECK(std::isfinite(value), "training diverged: the loss is ", value, " at epoch ",
                position_.epoch + 1, " batch ", loaded.index + 1, " (lower --lr or set --clip-grad)");
    return {value, correct_top_k(logits.detach(), labels, 1)};
  }

  void optimizer_step() {
    if (config_.optimization.clip_grad > 0) {
      torch::nn::utils::clip_grad_norm_(model_.module()->parameters(), config_.optimization.clip_grad);
    }
    optimizer_->step();
    optimizer_->zero_grad();
    ++position_.step;
  }

  void save_position(int64_t next_batch, const EpochTotals& totals) {
    position_.next_batch = next_batch;
    position_.totals = totals;
    if (parallel_.is_main()) saver_.stopped(config_, position_, *model_.module(), *optimizer_);
    parallel_.wait_for_main_writes();
  }

  Evaluation end_epoch() {
    const auto evaluation = evaluate_shards(model_, *val_loader_, config_.optimization.precision, parallel_);
    const auto t = parallel_.sum(epoch_totals_);
    EpochMetrics m;
    m.epoch = position_.epoch + 1;
    m.train_loss = t.loss_sum / std::max<int64_t>(1, t.samples);
    m.train_top1 = 100.0 * t.correct / std::max<int64_t>(1, t.samples);
    m.val_loss = evaluation.loss;
    m.val_top1 = evaluation.top1;
    m.val_top5 = evaluation.top5;
    m.lr = schedule_.at(std::max<int64_t>(0, position_.step - 1));
    m.epoch_time_s = t.seconds;
    m.images_per_s = t.seconds > 0 ? t.samples / t.seconds : 0.0;
    m.skipped = t.skipped;
    if (parallel_.is_main()) metrics_.add(m);
    const bool best = evaluation.top1 > position_.best_top1;
    if (best) {
      position_.best_top1 = evaluation.top1;
      position_.best_epoch = position_.epoch;
    }
    // The next position is the start of the next epoch.
    TrainingPosition next = position_;
    next.epoch = position_.epoch + 1;
    next.next_batch = 0;
    next.totals = EpochTotals{};
    if (parallel_.is_main()) saver_.epoch_done(config_, next, *model_.module(), *optimizer_, best);
    parallel_.wait_for_main_writes();
    report([&](TrainingSink& s) { s.epoch_done(m, evaluation, config_.optimization.epochs); });
    position_.next_batch = 0;
    position_.totals = EpochTotals{};
    return evaluation;
  }

  TrainConfig config_;
  std::string run_dir_;
  checkpoint::CheckpointSaver saver_{run_dir_};
  TrainingPosition position_;
  TrainHooks hooks_;
  c10::Device device_;
  DataParallel parallel_;  // over no group: a single process
  std::unique_ptr<data::BatchStream> train_loader_, val_loader_;
  models::Model model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  LrSchedule schedule_;
  MetricsLog metrics_;
  EpochTotals epoch_totals_;
};

}  // namespace

models::Model make_model(const TrainConfig& config, const c10::Device& device) {
  check_device(device, "device");
  auto model = models::build_model(config.model, config.model_config);
  model.module()->to(device);
  if (config.optimization.precision == Precision::Float64) model.module()->to(at::kDouble);
  return model;
}

Evaluation evaluate(models::Model& model, data::BatchStream& loader, Precision precision,
                    dist::ProcessGroup* group) {
  DataParallel parallel(group);
  return evaluate_shards(model, loader, precision, parallel);
}

namespace {

// A run, new (resumed: null) or continued.
TrainResult train_run(const TrainConfig& requested, Resumption* resumed, const TrainHooks& hooks,
                      bool allow_non_finite, const c10::Device& device, dist::ProcessGroup* group) {
  check_device(device, "device");
  TrainingPosition position;
  std::string run_dir;
  const std::string resume = resumed != nullptr ? resumed->path() : "";
  if (resumed != nullptr) {
    position = resumed->position();
    run_dir = fs::path(resume).parent_path().string();
    if (run_dir.empty()) run_dir = ".";
  } else {
    run_dir = (fs::path(requested.run.output) /
               (requested.run.experiment.empty() ? default_experiment(requested) : requested.run.experiment))
                  .string();
    // The default name holds the time: every rank takes rank 0's.
    if (group != nullptr) run_dir = group->share_from_main("run_dir", run_dir);
    TORCH_CHECK(!fs::exists(latest_checkpoint_path(run_dir)), "run directory '", run_dir,
                "' already holds a run; continue it with --resume ", latest_checkpoint_path(run_dir),
                " or choose another --experiment");
  }
  validate(requested);
  // Read now, before the data: a missing or damaged file fails at once (holds_run opens it).
  if (resume.empty() && !requested.run.initial_checkpoint.empty())
    holds_run(requested.run.initial_checkpoint);
  auto train_data = load_split(requested, data::Split::Train);
  auto config = resolve_config(requested, train_data);
  const int64_t stored_world_size = config.run.world_size;
  config.run.world_size = group != nullptr ? group->world_size() : 1;
  config.run.dist_backend = group != nullptr ? dist::to_string(group->backend()) : "";
  // Within an epoch a position counts this world's batches; an epoch boundary suits any world.
  TORCH_CHECK(position.next_batch == 0 || stored_world_size == config.run.world_size, "checkpoint '", resume,
              "' stopped within epoch ", position.epoch + 1, " of a run of ", stored_world_size,
              " process(es); resume it with ", stored_world_size,
              " (a run resumes with another number of "
              "processes only from the end of an epoch)");
  TORCH_CHECK(position.epoch <= config.optimization.epochs, "checkpoint '", resume, "' is at epoch ",
              position.epoch, ", past the run's ", config.optimization.epochs, " epochs");
  // The model's initialisation and everything random in training (dropout, random candidates)
  // follow torch's global generator; the loader has its own (seed, epoch, index) streams.
  at::manual_seed(config.run.seed);
  // Before the run directory is made: a checkpoint that does not load leaves nothing behind.
  Trainer trainer(config, std::move(train_data), run_dir, position, hooks, resumed, allow_non_finite, device,
                  group);
  fs::create_directories(run_dir);
  if (group == nullptr || group->is_main()) write_config(run_dir, config);
  return trainer.run();
}

}  // namespace

TrainResult train(const TrainConfig& config, const std::string& resume, const TrainHooks& hooks,
                  bool allow_non_finite, const c10::Device& device, dist::ProcessGroup* group) {
  if (resume.empty()) return train_run(config, nullptr, hooks, allow_non_finite, device, group);
  Resumption resumed(resume);
  return train_run(config, &resumed, hooks, allow_non_finite, device, group);
}

TrainResult train(const TrainConfig& config, Resumption& resumed, const TrainHooks& hooks,
                  bool allow_non_finite, const c10::Device& device, dist::ProcessGroup* group) {
  return train_run(config, &resumed, hooks, allow_non_finite, device, group);
}

Evaluation evaluate_checkpoint(const std::string& checkpoint, const TrainConfig& requested, data::Split split,
                               Precision precision, bool allow_non_finite, const c10::Device& device,
                               const std::function<void(const std::string&)>& on_skipped_sample) {
  check_device(device, "device");
  validate(requested);
  auto data = load_split(requested, split);
  auto config = requested;
  // Weights alone: the model takes its sizes from the data, as in training.
  if (!holds_run(checkpoint)) config = resolve_config(config, data);
  const auto& m = config.model_config;
  TORCH_CHECK(data.num_classes() == m.num_classes, "checkpoint '", checkpoint, "' was trained on ",
              m.num_classes.value_or(0), " classes; the data set has ", data.num_classes());
  if (!data.image_folder && !data.text) {
    const auto& set = data.set;
    TORCH_CHECK(set.channels() == m.in_channels && set.height() == m.image_size &&
                    set.width() == m.image_size,
                "checkpoint '", checkpoint, "' was trained on ", m.in_channels, "x", m.image_size, "x",
                m.image_size, " images; the data set has ", set.channels(), "x", set.height(), "x",
                set.width());
  }
  auto model = make_model(config, device);
  load_checkpoint(checkpoint, *model.module(), nullptr, allow_non_finite);
  auto loader = make_batches(std::move(data), config, /*training=*/false, device, nullptr, on_skipped_sample);
  return evaluate(model, *loader, precision);
}

}  // namespace convnn::train
