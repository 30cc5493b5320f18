#pragma once
// Small data set files written by the tests themselves: IDX (raw or gzip) and CIFAR binaries in a
// temporary directory, plus a helper to capture c10::Error messages.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace convnn::testing {

using Bytes = std::vector<uint8_t>;

/// A fresh directory under the system temp directory, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  /// path() / name as a string.
  std::string file(const std::string& name) const;

 private:
  std::filesystem::path path_;
};

void write_file(const std::string& path, const Bytes& bytes);

/// A valid gzip stream of `data` made of stored (uncompressed) deflate blocks: the test binary
/// does not link zlib, and a hand-made stream also checks the reader against the format itself.
Bytes gzip_stored(const Bytes& data);

/// IDX files: images uint8 [N,1,H,W] (or [N,H,W]), labels any integer [N] in [0, 256).
Bytes idx_images(const at::Tensor& images);
Bytes idx_labels(const at::Tensor& labels);
/// CIFAR records: images uint8 [N,3,32,32]; labels int [N]; coarse labels only for CIFAR-100.
Bytes cifar_records(const at::Tensor& images, const at::Tensor& labels,
                    const at::Tensor& coarse = {});

/// Random uint8 images of the given shape, from a seeded generator.
at::Tensor random_images(at::IntArrayRef shape, uint64_t seed);

/// The message of the c10::Error that `f` throws; "<no error>" when it throws none.
std::string error_of(const std::function<void()>& f);
/// EXPECTs that `f` throws a c10::Error whose message holds both `path` and `what`.
void expect_error(const std::function<void()>& f, const std::string& path,
                  const std::string& what);

}  // namespace convnn::testing
