#include "convnn/data/subset.h"

#include <ATen/ATen.h>

#include "convnn/data/loader.h"

namespace convnn::data {
namespace {

// The first n samples of a seeded shuffle.
std::vector<int64_t> subset_order(int64_t size, int64_t n, uint64_t seed) {
  const auto order = epoch_order(size, /*shuffle=*/true, seed, /*epoch=*/0);
  return std::vector<int64_t>(order.begin(), order.begin() + n);
}

}  // namespace

ImageSet subset(ImageSet set, int64_t n, uint64_t seed) {
  if (n == 0 || n >= set.size()) return set;
  const auto picked = at::tensor(subset_order(set.size(), n, seed), at::kLong);
  set.images = set.images.index_select(0, picked).contiguous();
  set.labels = set.labels.index_select(0, picked).contiguous();
  return set;
}

FileList subset(FileList files, int64_t n, uint64_t seed) {
  if (n == 0 || n >= files.size()) return files;
  FileList picked;
  picked.class_names = std::move(files.class_names);
  for (const int64_t i : subset_order(files.size(), n, seed)) {
    picked.paths.push_back(std::move(files.paths[static_cast<size_t>(i)]));
    picked.labels.push_back(files.labels[static_cast<size_t>(i)]);
  }
  return picked;
}

}  // namespace convnn::data
