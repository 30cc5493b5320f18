#pragma once
// `convnn bench --data DIR`: images per second of the input pipeline (read + decode + training
// transforms + collate with MixUp / CutMix) through the real DataLoader, and a per-stage
// breakdown on one thread. `convnn bench --make-data DIR --images N`: an ImageFolder of
// ImageNet-sized JPEGs to run it on. Method and results: BENCHMARKS.md, docs/data.md.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "convnn/data/config.h"

namespace convnn::cli {

struct DataBenchArgs {
  std::string data;       // ImageFolder root (train/ inside) to measure
  std::string make_data;  // ImageFolder root to write
  int64_t images = 1000;  // --make-data: training images (validation: a tenth more)
  int64_t workers = 2;
  int64_t batches = 30;
  int64_t image_size = data::kDefaultFolderImageSize;
  std::string recipe = data::to_string(data::Recipe::Paper);
  int64_t stage_images = 200;  // images of the one-thread per-stage breakdown
};

/// Registers --data, --make-data, --images, --workers, --batches, --image-size, --recipe and
/// --stage-images on the bench subcommand (an "Input pipeline" group).
void add_data_bench_options(CLI::App* sub, DataBenchArgs& args);

bool data_bench_requested(const DataBenchArgs& args);

/// Runs what the options ask for; `batch`, `seed` and `json` are the bench's own options.
int run_data_bench(const DataBenchArgs& args, int64_t batch, uint64_t seed, bool json);

}  // namespace convnn::cli
