// `convnn bench --data` / `--make-data`: the input pipeline's throughput through the real
// DataLoader and where its time goes, and a generated ImageFolder to measure it on.
#include "bench_data.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "convnn/data/image_codec.h"
#include "convnn/data/image_folder_source.h"
#include "convnn/data/loader.h"
#include "convnn/checkpoint/checkpoint.h"
#include "convnn/train/trainer.h"
#include "sinks.h"

namespace convnn::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// --------------------------------------------------------------------------- --make-data

// Debian's python-matplotlib-data ships this real photograph (512 x 600): crops of it have the
// statistics of photographs, which decoding speed depends on (smooth areas, edges, noise).
constexpr const char* kPhoto = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg";
constexpr int64_t kWidth = 500, kHeight = 375;  // ImageNet's most common size
constexpr int64_t kClasses = 4;
constexpr int kQuality = 90;
constexpr uint64_t kMakeStream = 0x6d616b65ULL;  // "make"

// A random 4:3 crop of the photo, maybe mirrored, with a per-channel gain and offset.
data::Image photo_variant(const data::Image& photo, data::Rng& rng) {
  const auto box = data::random_resized_crop_box(photo.height, photo.width, rng, {0.25, 0.6},
                                                 {1.25, 1.42});
  auto image = data::crop(photo, box.top, box.left, box.height, box.width);
  if (rng.bernoulli(0.5)) data::horizontal_flip(image);
  for (int64_t c = 0; c < 3; ++c) {
    const double gain = rng.uniform(0.8, 1.2), offset = rng.uniform(-20.0, 20.0);
    for (size_t i = static_cast<size_t>(c); i < image.pixels.size(); i += 3) {
      image.pixels[i] =
          static_cast<uint8_t>(std::clamp(std::lround(image.pixels[i] * gain + offset), 0L, 255L));
    }
  }
  return data::resize(image, kHeight, kWidth, data::Interpolation::Bicubic);
}

// Without the photo: smooth random waves plus a little noise, far easier on the decoder than a
// photograph (so the measured speed is an upper bound).
data::Image smooth_variant(data::Rng& rng) {
  data::Image image(kHeight, kWidth);
  double fx[3], fy[3], phase[3];
  for (int c = 0; c < 3; ++c) {
    fx[c] = rng.uniform(0.5, 4.0);
    fy[c] = rng.uniform(0.5, 4.0);
    phase[c] = rng.uniform(0.0, 6.283185307179586);
  }
  for (int64_t y = 0; y < kHeight; ++y) {
    for (int64_t x = 0; x < kWidth; ++x) {
      for (int c = 0; c < 3; ++c) {
        const double wave = std::sin(6.283185307179586 * fx[c] * x / kWidth + phase[c]) *
                            std::cos(6.283185307179586 * fy[c] * y / kHeight);
        const double v = 128.0 + 90.0 * wave + rng.uniform(-8.0, 8.0);
        image.at(y, x)[c] = static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L));
      }
    }
  }
  return image;
}

void write_split(const fs::path& root, const std::string& split, int64_t count,
                 const data::Image* photo, uint64_t seed) {
  for (int64_t i = 0; i < count; ++i) {
    data::Rng rng(kMakeStream, seed, split == "train" ? 0 : 1, static_cast<uint64_t>(i));
    const auto image = photo ? photo_variant(*photo, rng) : smooth_variant(rng);
    const auto bytes = data::encode_jpeg(image, kQuality);
    const auto dir = root / split / fmt::format("class{}", i % kClasses);
    fs::create_directories(dir);
    checkpoint::write_file_atomically((dir / fmt::format("{}_{:06d}.jpg", split, i)).string(),
                                 std::string(bytes.begin(), bytes.end()));
  }
}

int make_data(const DataBenchArgs& a, uint64_t seed, bool json) {
  TORCH_CHECK(a.images >= kClasses, "bench: --images must be >= ", kClasses,
              " (one per class), got ", a.images);
  std::optional<data::Image> photo;
  if (fs::exists(kPhoto)) {
    photo = data::read_image(kPhoto);
  } else {
    std::cerr << "bench: notice: " << kPhoto << " is missing (Debian: apt-get install "
              << "python-matplotlib-data); writing smooth generated images instead, which decode "
                 "faster than photographs\n";
  }
  const auto started = Clock::now();
  const int64_t val = std::max(kClasses, a.images / 10);
  write_split(a.make_data, "train", a.images, photo ? &*photo : nullptr, seed);
  write_split(a.make_data, "val", val, photo ? &*photo : nullptr, seed);
  // With --json the report is stdout's only content.
  fmt::print(json ? stderr : stdout,
             "wrote {} training and {} validation JPEGs ({}x{}, quality {}, {} classes, from {}) under {} "
             "in {:.1f} s\n",
             a.images, val, kWidth, kHeight, kQuality, kClasses,
             photo ? "crops of grace_hopper.jpg" : "generated content", a.make_data,
             seconds_since(started));
  return 0;
}

// ----------------------------------------------------------------------------------- --data

struct LoaderRun {
  int64_t batches = 0, images = 0, skipped = 0;
  double seconds = 0.0;
};

// Batches from the start of the pipeline (threads idle, queue empty) to the last one asked for,
// epoch after epoch if needed: a trainer that never waits on anything else sees this rate.
LoaderRun time_loader(data::DataLoader& loader, int64_t batches) {
  TORCH_CHECK(loader.batches_per_epoch() > 0, "bench: the folder has ", loader.size(),
              " training images, fewer than one batch");
  LoaderRun run;
  int64_t epoch = 0;
  const auto started = Clock::now();
  loader.start_epoch(epoch);
  while (run.batches < batches) {
    auto batch = loader.next();
    if (!batch) {
      loader.start_epoch(++epoch);
      continue;
    }
    ++run.batches;
    run.images += batch->labels.size(0);
    run.skipped += static_cast<int64_t>(batch->skipped.size());
  }
  run.seconds = seconds_since(started);
  return run;
}

// Reads every file once, so that the timed runs find them in the page cache, as a training run
// does after its first epoch (with a data set that fits in memory).
void warm_page_cache(const data::FileList& files) {
  std::vector<char> buffer(1 << 20);
  for (const auto& path : files.paths) {
    std::ifstream in(path, std::ios::binary);
    while (in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()))) {
    }
  }
}

struct Stage {
  const char* name;
  double ms;  // per image
};

// The source's stages on this thread over the first `count` images, then MixUp / CutMix per
// image on batches of `batch`.
std::vector<Stage> time_stages(const data::ImageFolderSource& source, int64_t count, int64_t batch,
                               const data::LoaderOptions& options, uint64_t seed) {
  data::StageTimes t;
  std::vector<float> out(static_cast<size_t>(source.sample_numel()));
  std::string error;
  for (int64_t i = 0; i < count; ++i) source.write_timed(i, seed, 0, out.data(), error, &t);
  const double n = static_cast<double>(std::max<int64_t>(1, t.samples));
  std::vector<Stage> stages = {{"read + decode", t.read_decode / n},
                               {"random resized crop", t.crop / n},
                               {"flip + RandAugment", t.flip_rand_augment / n},
                               {"colour jitter", t.color_jitter / n},
                               {"normalise + erasing", t.normalize_erase / n}};
  if (options.mixup) {
    const auto shape = source.sample_shape();
    auto images = at::randn({batch, shape[0], shape[1], shape[2]});
    const auto labels = at::arange(batch, at::kLong).remainder(source.num_classes());
    at::Tensor targets;
    constexpr int64_t kRounds = 10;
    const auto started = Clock::now();
    for (int64_t r = 0; r < kRounds; ++r) {
      data::Rng rng(0, seed, 0, static_cast<uint64_t>(r));
      data::mixup_cutmix(images, labels, source.num_classes(), rng, *options.mixup, targets);
    }
    stages.push_back({"mixup / cutmix", seconds_since(started) * 1e3 / (kRounds * batch)});
  }
  return stages;
}

// The resolved config's augmentation (apply_recipe has filled every optional).
std::string recipe_text(const train::TrainConfig& c) {
  const auto& a = c.augmentation;
  return fmt::format(
      "RRC scale {}-{} ratio {:.2f}-{:.2f} bicubic, flip {}, RandAugment m{} n{} mstd{}, "
      "colour jitter {}, erasing {}, mixup {} / cutmix {} (switch {}), label smoothing {}",
      a.scale_min, a.scale_max, a.ratio_min, a.ratio_max, *a.hflip, *a.rand_augment, a.rand_augment_ops,
      a.rand_augment_mstd, *a.color_jitter, *a.reprob, *a.mixup, *a.cutmix, a.mixup_switch_prob,
      c.optimization.smoothing);
}

train::TrainConfig bench_config(const DataBenchArgs& a, int64_t batch, uint64_t seed) {
  train::TrainConfig c;
  c.data.dataset = "imagefolder";
  c.data.data_dir = a.data;
  c.data.image_size = a.image_size;
  c.augmentation.recipe = data::parse_recipe(a.recipe);
  c.optimization.batch_size = batch;
  c.data.workers = a.workers;
  c.run.seed = seed;
  train::validate(c);
  return train::apply_recipe(c);
}

int measure(const DataBenchArgs& a, int64_t batch, uint64_t seed, bool json) {
  TORCH_CHECK(a.batches >= 1, "bench: --batches must be >= 1, got ", a.batches);
  TORCH_CHECK(a.stage_images >= 1, "bench: --stage-images must be >= 1, got ", a.stage_images);
  const auto config = bench_config(a, batch, seed);
  auto data = train::load_split(config, data::Split::Train);
  warm_page_cache(data.files);
  const data::ImageFolderSource source(data.files,
                                       data::image_transform_options(config.data, config.augmentation, true));
  const auto options =
      data::loader_options(config.data, config.augmentation, train::loader_setup(config, true));
  const auto stages = time_stages(source, std::min(a.stage_images, source.size()), batch, options, seed);
  auto loader = train::make_loader(std::move(data), config, true, c10::Device(c10::kCPU), nullptr,
                                   print_skipped_sample);
  const auto run = time_loader(loader, a.batches);
  double total_ms = 0.0;
  for (const auto& s : stages) total_ms += s.ms;
  const double rate = run.images / run.seconds;
  const int64_t staged = std::min(a.stage_images, source.size());

  if (json) {
    nlohmann::json stage_json = nlohmann::json::object();
    for (const auto& s : stages) stage_json[s.name] = s.ms;
    nlohmann::json out{{"data", a.data},
                       {"training_images", source.size()},
                       {"classes", source.num_classes()},
                       {"image_size", *config.data.image_size},
                       {"recipe", data::to_string(*config.augmentation.recipe)},
                       {"recipe_values", recipe_text(config)},
                       {"batch", batch},
                       {"workers", a.workers},
                       {"hardware_threads", std::thread::hardware_concurrency()},
                       {"loader",
                        {{"batches", run.batches},
                         {"images", run.images},
                         {"skipped", run.skipped},
                         {"seconds", run.seconds},
                         {"images_per_s", rate}}},
                       {"stages_ms_per_image", stage_json},
                       {"stage_images", staged},
                       {"one_thread_ms_per_image", total_ms},
                       {"one_thread_images_per_s", 1e3 / total_ms}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  fmt::print("input pipeline: {} ({} training images, {} classes), image size {}, recipe {}\n  {}\n", a.data,
             source.size(), source.num_classes(), *config.data.image_size,
             data::to_string(*config.augmentation.recipe), recipe_text(config));
  fmt::print("\nDataLoader, {} workers ({} hardware threads), batch {}: {} batches, {} images in {:.2f} s: "
             "{:.1f} images/s{}\n",
             a.workers, std::thread::hardware_concurrency(), batch, run.batches, run.images, run.seconds, rate,
             run.skipped ? fmt::format(" ({} unreadable files skipped)", run.skipped) : "");
  fmt::print("\nper stage on one thread (mean over {} images):\n", staged);
  for (const auto& s : stages) {
    fmt::print("  {:<22} {:>7.3f} ms  {:>5.1f}%\n", s.name, s.ms, 100.0 * s.ms / total_ms);
  }
  fmt::print("  {:<22} {:>7.3f} ms  = {:.0f} images/s on one thread\n", "total", total_ms, 1e3 / total_ms);
  return 0;
}

}  // namespace

void add_data_bench_options(CLI::App* sub, DataBenchArgs& a) {
  const std::string group = "Input pipeline (instead of the ConvNN benchmark)";
  sub->add_option("--data", a.data,
                  "Measure the input pipeline on this ImageFolder root (train/ inside): images/s through "
                  "the DataLoader, and a per-stage breakdown on one thread")
      ->group(group);
  sub->add_option("--make-data", a.make_data,
                  "Write an ImageFolder (train/, val/, 4 classes) of 500x375 JPEGs (quality 90) made from "
                  "crops of a real photograph, to measure with --data")
      ->group(group);
  sub->add_option("--images", a.images, "--make-data: training images (validation: a tenth)")
      ->group(group);
  sub->add_option("--workers", a.workers, "--data: loader threads")->group(group);
  sub->add_option("--batches", a.batches, "--data: batches timed (--batch images each)")->group(group);
  sub->add_option("--image-size", a.image_size, "--data: crop size")->group(group);
  sub->add_option("--recipe", a.recipe, "--data: augmentation recipe")
      ->check(CLI::IsMember(data::recipe_names()))
      ->group(group);
  sub->add_option("--stage-images", a.stage_images, "--data: images of the per-stage breakdown")
      ->group(group);
}

bool data_bench_requested(const DataBenchArgs& a) { return !a.data.empty() || !a.make_data.empty(); }

int run_data_bench(const DataBenchArgs& a, int64_t batch, uint64_t seed, bool json) {
  TORCH_CHECK(batch >= 1, "bench: --batch must be >= 1, got ", batch);
  if (!a.make_data.empty()) {
    make_data(a, seed, json);
    if (a.data.empty()) return 0;
  }
  return measure(a, batch, seed, json);
}

}  // namespace convnn::cli
