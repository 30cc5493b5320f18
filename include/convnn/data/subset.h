#pragma once
// Training on part of a data set: the first n samples of a shuffle seeded by `seed` (the loader's
// epoch-0 order for that seed), all of them when n is 0 or at least the size.
#include <cstdint>

#include "convnn/data/datasets.h"
#include "convnn/data/image_folder_source.h"

namespace convnn::data {

ImageSet subset(ImageSet set, int64_t n, uint64_t seed);
FileList subset(FileList files, int64_t n, uint64_t seed);

}  // namespace convnn::data
