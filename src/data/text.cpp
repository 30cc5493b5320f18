#include "convnn/data/text.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "convnn/data/loader.h"
#include "convnn/data/rng.h"

namespace convnn::data {
namespace {

namespace fs = std::filesystem;

// Its own stream: the window offsets never move when the order's draws change.
constexpr uint64_t kOffsetStream = 0x6f6666736574ULL;  // "offset"
// The fixed shuffle that picks the evaluation windows of max_windows.
constexpr uint64_t kEvaluationSubsetEpoch = 0;

constexpr const char* kFortunes = "fortunes";

bool is_blank(const std::string& text) {
  return std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isspace(c) != 0; });
}

// The documents of one fortune file: the text between lines that hold only "%".
void append_documents(const fs::path& file, std::vector<std::string>& documents) {
  std::ifstream in(file, std::ios::binary);
  TORCH_CHECK(in, "read_fortune_documents: cannot read '", file.string(), "'");
  std::string line, document;
  const auto flush = [&] {
    if (!is_blank(document)) documents.push_back(document);
    document.clear();
  };
  while (std::getline(in, line)) {
    if (line == "%") {
      flush();
    } else {
      document += line;
      document += '\n';
    }
  }
  flush();
}

void check_tokens(const at::Tensor& tokens, const char* who) {
  TORCH_CHECK(tokens.defined() && tokens.dim() == 1 && !tokens.is_floating_point() && !tokens.is_complex() &&
                  tokens.scalar_type() != at::kBool,
              who, ": tokens must be a 1-D integer tensor, got ",
              tokens.defined() ? c10::str(c10::toString(tokens.scalar_type()), " ", tokens.sizes())
                               : std::string("an undefined tensor"));
  if (tokens.numel() == 0) return;
  const auto low = tokens.min().item<int64_t>(), high = tokens.max().item<int64_t>();
  TORCH_CHECK(low >= 0 && high < kByteVocabulary, who, ": tokens must be bytes in [0, ", kByteVocabulary,
              "), got values in [", low, ", ", high, "]");
}

at::Tensor bytes_of(const std::string& text) {
  auto out = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
  std::copy(text.begin(), text.end(), reinterpret_cast<char*>(out.data_ptr<uint8_t>()));
  return out;
}

}  // namespace

const std::vector<std::string>& text_dataset_names() {
  static const std::vector<std::string> names{kFortunes};
  return names;
}

bool is_text_dataset(const std::string& name) {
  const auto& names = text_dataset_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string default_text_dir(const std::string& name) {
  TORCH_CHECK(is_text_dataset(name), "default_text_dir: '", name, "' is not a text data set");
  return "/usr/share/games/fortunes";
}

std::vector<std::string> read_fortune_documents(const std::string& dir) {
  TORCH_CHECK(fs::is_directory(dir), "read_fortune_documents: '", dir,
              "' is not a folder (Debian's fortunes package installs /usr/share/games/fortunes)");
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_symlink() || !entry.is_regular_file() || entry.path().has_extension()) continue;
    files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> documents;
  for (const auto& file : files) append_documents(file, documents);
  TORCH_CHECK(!documents.empty(), "read_fortune_documents: '", dir,
              "' holds no document (files without an extension, documents separated by lines of '%')");
  return documents;
}

TextSplits split_documents(const std::vector<std::string>& documents, double validation_fraction, uint64_t seed) {
  const auto n = static_cast<int64_t>(documents.size());
  TORCH_CHECK(n >= 2, "split_documents: needs at least 2 documents (one per split), got ", n);
  TORCH_CHECK(std::isfinite(validation_fraction) && validation_fraction > 0.0 && validation_fraction < 1.0,
              "split_documents: validation_fraction must be in (0, 1), got ", validation_fraction);
  const int64_t held_out =
      std::clamp<int64_t>(std::llround(validation_fraction * static_cast<double>(n)), 1, n - 1);
  const auto order = epoch_order(n, /*shuffle=*/true, seed, /*epoch=*/0);
  std::vector<bool> in_validation(static_cast<size_t>(n), false);
  for (int64_t i = 0; i < held_out; ++i) in_validation[static_cast<size_t>(order[static_cast<size_t>(i)])] = true;
  std::string train, validation;
  for (int64_t i = 0; i < n; ++i) {
    auto& text = in_validation[static_cast<size_t>(i)] ? validation : train;
    text += documents[static_cast<size_t>(i)];
    text += kDocumentSeparator;
  }
  return {bytes_of(train), bytes_of(validation)};
}

at::Tensor encode_bytes(std::string_view text) {
  auto out = at::empty({static_cast<int64_t>(text.size())}, at::kLong);
  auto* p = out.data_ptr<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) p[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string decode_bytes(const at::Tensor& tokens) {
  check_tokens(tokens, "decode_bytes");
  const auto bytes = tokens.to(at::kCPU, at::kByte).contiguous();
  const auto* p = bytes.const_data_ptr<uint8_t>();
  return std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(bytes.numel()));
}

const std::vector<std::string>& byte_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    for (int c = 0; c < kByteVocabulary; ++c) {
      all.push_back(c >= 0x20 && c < 0x7f ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02x}", c));
    }
    return all;
  }();
  return names;
}

// ------------------------------------------------------------------------------------ TokenLoader

TokenLoader::TokenLoader(at::Tensor tokens, TokenLoaderOptions options) : options_(options) {
  check_tokens(tokens, "TokenLoader");
  const auto& o = options_;
  TORCH_CHECK(o.context >= 1, "TokenLoader: context must be >= 1, got ", o.context);
  TORCH_CHECK(o.batch_size >= 1, "TokenLoader: batch_size must be >= 1, got ", o.batch_size);
  TORCH_CHECK(o.max_windows >= 0, "TokenLoader: max_windows must be >= 0 (0: all), got ", o.max_windows);
  TORCH_CHECK(o.shard_count >= 1 && o.shard_rank >= 0 && o.shard_rank < o.shard_count,
              "TokenLoader: shard_rank must be in [0, shard_count) and shard_count >= 1, got shard_rank ",
              o.shard_rank, " of ", o.shard_count);
  tokens_ = tokens.to(at::kCPU, at::kByte).contiguous();
  const int64_t needed = o.training ? 2 * o.context : o.context + 1;
  TORCH_CHECK(tokens_.numel() >= needed, "TokenLoader: ", tokens_.numel(), " tokens are too few for context ",
              o.context, ": ", o.training ? "training" : "evaluation", " needs at least ", needed);
  // Every epoch has as many windows: counted once, not at each batch.
  samples_ = static_cast<int64_t>(window_order(0).size());
}

int64_t TokenLoader::windows() const {
  const int64_t length = tokens_.numel(), t = options_.context;
  // Training starts at an offset below t: (length - t) / t windows fit whatever the offset, so every
  // epoch has as many batches.
  return options_.training ? (length - t) / t : (length - 1) / t;
}

std::vector<int64_t> TokenLoader::window_order(int64_t epoch) const {
  const auto& o = options_;
  auto order = o.training ? epoch_order(windows(), true, o.seed, epoch)
                          : epoch_order(windows(), o.max_windows > 0, o.seed, kEvaluationSubsetEpoch);
  if (o.max_windows > 0 && o.max_windows < static_cast<int64_t>(order.size())) {
    order.resize(static_cast<size_t>(o.max_windows));
    if (!o.training) std::sort(order.begin(), order.end());
  }
  return shard_order(order, o.shard_rank, o.shard_count, /*pad=*/o.training);
}

int64_t TokenLoader::samples_per_epoch() const { return samples_; }

int64_t TokenLoader::batches_per_epoch() const {
  const int64_t samples = samples_per_epoch(), b = options_.batch_size;
  return options_.training ? samples / b : (samples + b - 1) / b;
}

void TokenLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  TORCH_CHECK(epoch >= 0, "TokenLoader::start_epoch: epoch must be >= 0, got ", epoch);
  TORCH_CHECK(first_batch >= 0 && first_batch <= batches_per_epoch(), "TokenLoader::start_epoch: first_batch must be in [0, ",
              batches_per_epoch(), "], got ", first_batch);
  epoch_ = epoch;
  next_batch_ = first_batch;
  order_ = window_order(epoch);
  offset_ = options_.training ? Rng(kOffsetStream, options_.seed, static_cast<uint64_t>(epoch)).below(options_.context)
                              : 0;
}

std::optional<Batch> TokenLoader::next() {
  if (next_batch_ >= batches_per_epoch()) return std::nullopt;
  const int64_t t = options_.context, b = options_.batch_size;
  const int64_t first = next_batch_ * b;
  const int64_t count = std::min<int64_t>(b, static_cast<int64_t>(order_.size()) - first);
  // Each window's t + 1 tokens: the inputs and, one further on, their labels.
  auto starts = at::empty({count, 1}, at::kLong);
  auto* s = starts.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) s[i] = offset_ + order_[static_cast<size_t>(first + i)] * t;
  const auto spans = (starts + at::arange(t + 1, at::kLong)).flatten();
  const auto windows = tokens_.index_select(0, spans).view({count, t + 1}).to(at::kLong);
  Batch batch;
  batch.inputs = windows.narrow(1, 0, t).contiguous();
  batch.labels = windows.narrow(1, 1, t).contiguous();
  batch.index = next_batch_++;
  return batch;
}

}  // namespace convnn::data
