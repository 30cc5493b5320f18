// CIFAR binary version (https://www.cs.toronto.edu/~kriz/cifar.html): fixed-size records of
// label byte(s) then a 3x32x32 image stored channel-major (all red, all green, all blue), which
// is already the [C,H,W] layout.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>

#include "convnn/data/datasets.h"
#include "data/file_bytes.h"

namespace convnn::data {
namespace {

constexpr int64_t kChannels = 3, kSide = 32, kPixels = kChannels * kSide * kSide;
constexpr int64_t kCifar100Coarse = 20;
// The most records a file may hold: all of CIFAR's 60,000 images (train and test) in one file. A
// bound for the reader, so that a gzip file inflating to gigabytes is stopped there.
constexpr int64_t kMaxRecords = 60000;

struct CifarFile {
  std::string path;
  std::vector<uint8_t> bytes;
  int64_t records = 0;
};

CifarFile read_checked(const std::string& path, int64_t record) {
  const char* what = "CIFAR";
  const std::string limit = std::to_string(kMaxRecords) + " records of " + std::to_string(record) +
                            " bytes, all of CIFAR's images in one file";
  CifarFile file{path,
                 detail::read_file_bytes(path, what, static_cast<size_t>(kMaxRecords * record), limit)};
  const auto size = static_cast<int64_t>(file.bytes.size());
  TORCH_CHECK(size > 0, what, " ", path, ": file is empty");
  TORCH_CHECK(size % record == 0, what, " ", path, ": size ", size,
              " bytes is not a multiple of the record size ", record, " (", size / record,
              " records and ", size % record, " bytes left over: truncated or not CIFAR)");
  file.records = size / record;
  return file;
}

// The label byte(s) of every record, checked before anything is copied so that a bad file
// reports its first bad record.
void check_labels(const CifarFile& file, int64_t label_bytes, int64_t num_classes) {
  const int64_t record = label_bytes + kPixels;
  for (int64_t r = 0; r < file.records; ++r) {
    const uint8_t* p = file.bytes.data() + r * record;
    const int64_t label = p[label_bytes - 1];
    TORCH_CHECK(label < num_classes, "CIFAR ", file.path, ": record ", r, " has label ", label,
                ", out of range [0, ", num_classes, ")");
    TORCH_CHECK(label_bytes == 1 || p[0] < kCifar100Coarse, "CIFAR ", file.path, ": record ", r,
                " has coarse label ", int{p[0]}, ", out of range [0, ", kCifar100Coarse, ")");
  }
}

}  // namespace

ImageSet read_cifar(const std::vector<std::string>& files, int64_t num_label_bytes,
                    std::vector<std::string> class_names) {
  TORCH_CHECK(!files.empty(), "read_cifar: no files given");
  TORCH_CHECK(num_label_bytes == 1 || num_label_bytes == 2,
              "read_cifar: num_label_bytes must be 1 (CIFAR-10) or 2 (CIFAR-100), got ",
              num_label_bytes);
  const auto num_classes = static_cast<int64_t>(class_names.size());
  TORCH_CHECK(num_classes >= 1 && num_classes <= 256,
              "read_cifar: class_names must hold 1 to 256 names, got ", num_classes);
  const int64_t record = num_label_bytes + kPixels;
  std::vector<CifarFile> loaded;
  int64_t total = 0;
  for (const auto& path : files) {
    loaded.push_back(read_checked(path, record));
    check_labels(loaded.back(), num_label_bytes, num_classes);
    total += loaded.back().records;
  }
  ImageSet set;
  set.images = at::empty({total, kChannels, kSide, kSide}, at::kByte);
  set.labels = at::empty({total}, at::kLong);
  auto* images = set.images.data_ptr<uint8_t>();
  auto* labels = set.labels.data_ptr<int64_t>();
  for (const auto& file : loaded) {
    for (int64_t r = 0; r < file.records; ++r, ++labels, images += kPixels) {
      const uint8_t* p = file.bytes.data() + r * record;
      *labels = p[num_label_bytes - 1];
      std::memcpy(images, p + num_label_bytes, kPixels);
    }
  }
  set.class_names = std::move(class_names);
  return set;
}

}  // namespace convnn::data
