// The block budget and the walk over blocks of query rows (src/ops/generic/internal.h).
#include <ATen/OpMathType.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "ops/generic/generic.h"
#include "ops/generic/internal.h"

namespace convnn::ops::generic {
namespace {

constexpr int64_t kDefaultBlockBytes = int64_t{256} << 20;
constexpr const char* kBlockBytesVariable = "CONVNN_GENERIC_BLOCK_BYTES";

int64_t block_bytes_from_environment() {
  const char* text = std::getenv(kBlockBytesVariable);
  if (text == nullptr || *text == '\0') return kDefaultBlockBytes;
  char* end = nullptr;
  errno = 0;
  const long long bytes = std::strtoll(text, &end, 10);
  TORCH_CHECK(errno == 0 && *end == '\0' && bytes > 0, "convnn: ", kBlockBytesVariable,
              " must be a positive integer number of bytes, got '", text, "'");
  return bytes;
}

std::atomic<int64_t>& budget() {
  static std::atomic<int64_t> bytes{block_bytes_from_environment()};
  return bytes;
}

}  // namespace

int64_t block_bytes() { return budget().load(); }

bool serves_cpu() {
  // Read during static registration, where an exception would abort the process: an unknown
  // value keeps the fused kernels and says so in the log.
  static const bool generic = [] {
    const char* value = std::getenv("CONVNN_CPU_KERNELS");
    if (value == nullptr || std::string_view(value) == "fused") return false;
    if (std::string_view(value) == "generic") return true;
    TORCH_WARN("CONVNN_CPU_KERNELS must be 'fused' or 'generic', got '", value,
               "'; using the fused CPU kernels");
    return false;
  }();
  return generic;
}

void set_block_bytes(int64_t bytes) {
  TORCH_CHECK(bytes > 0, "convnn::ops::generic::set_block_bytes: bytes must be positive, got ",
              bytes);
  budget().store(bytes);
}

void for_each_row_block(int64_t g, int64_t n, int64_t bytes_per_slice_row,
                        const std::function<void(const RowBlock&)>& visit) {
  const int64_t budget_bytes = block_bytes();
  const int64_t per_row = std::max<int64_t>(bytes_per_slice_row, 1);
  const int64_t most_rows = std::clamp<int64_t>(budget_bytes / per_row, 1, std::max<int64_t>(n, 1));
  // Blocks of nearly equal size: no ragged last block of a few rows, which would take another,
  // slower matrix-product kernel than the others.
  const int64_t row_blocks = (n + most_rows - 1) / most_rows;
  const int64_t rows = row_blocks > 0 ? (n + row_blocks - 1) / row_blocks : 1;
  // When whole slices fit, a block takes as many of them as the budget allows.
  const int64_t slices =
      std::clamp<int64_t>(budget_bytes / (per_row * rows), 1, std::max<int64_t>(g, 1));
  for (int64_t slice = 0; slice < g; slice += slices) {
    for (int64_t row = 0; row < n; row += rows) {
      visit({slice, std::min(slices, g - slice), row, std::min(rows, n - row)});
    }
  }
}

at::Tensor block_of(const at::Tensor& t, const RowBlock& block) {
  return t.narrow(0, block.slice, block.slices).narrow(1, block.row, block.rows);
}

void BlockedGradient::copy_rows(const at::Tensor& block_grad, const at::Tensor& like, const RowBlock& block) {
  if (!block_grad.defined()) return;
  if (!total_.defined()) {
    dtype_ = like.scalar_type();
    total_ = at::empty_like(like, at::MemoryFormat::Contiguous);  // every row is copied once
  }
  block_of(total_, block).copy_(block_grad);
}

void BlockedGradient::add_slices(const at::Tensor& block_grad, const at::Tensor& like, const RowBlock& block) {
  if (!block_grad.defined()) return;
  accumulator_for(like).narrow(0, block.slice, block.slices).add_(block_grad);
}

void BlockedGradient::add_whole(const at::Tensor& block_grad, const at::Tensor& like) {
  if (block_grad.defined()) accumulator_for(like).add_(block_grad);
}

at::Tensor BlockedGradient::result() const { return total_.defined() ? total_.to(dtype_) : total_; }

at::Tensor& BlockedGradient::accumulator_for(const at::Tensor& like) {
  if (!total_.defined()) {
    dtype_ = like.scalar_type();
    total_ = at::zeros_like(like, like.options().dtype(at::toOpMathType(dtype_)), at::MemoryFormat::Contiguous);
  }
  return total_;
}

}  // namespace convnn::ops::generic
