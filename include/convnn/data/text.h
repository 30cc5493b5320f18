#pragma once
// Text for language models: a corpus read from its files, split into training and validation
// documents, tokenised to bytes, and served as batches of fixed-length windows (next-token
// prediction) through the same BatchStream interface the image loaders have, so that the trainer's
// loop, checkpoints and resume serve both.
//
// The corpus is Debian's `fortunes` package (2.5 MB of English text in /usr/share/games/fortunes):
// files of short documents separated by lines holding only "%".
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "convnn/data/batch_stream.h"

namespace convnn::data {

/// Tokens are bytes: a vocabulary of 256, any text (UTF-8 included) encodes without loss.
inline constexpr int64_t kByteVocabulary = 256;
/// What follows each document in a split's text: the corpus's own separator line.
inline constexpr std::string_view kDocumentSeparator = "%\n";
/// The share of documents held out for validation, and the seed of that choice: one split for
/// every run, whatever its seed, so that runs compare on the same text.
inline constexpr double kTextValidationFraction = 0.05;
inline constexpr uint64_t kTextSplitSeed = 0;

/// The text data sets a DataConfig names ("fortunes").
const std::vector<std::string>& text_dataset_names();
bool is_text_dataset(const std::string& name);
/// Where a text data set lives when --data-dir is not given (fortunes: /usr/share/games/fortunes).
std::string default_text_dir(const std::string& name);

/// The documents of a corpus in the fortune format: every regular file of `dir` whose name has no
/// extension (not strfile's *.dat indexes, not the *.u8 links), in name order, each split at the
/// lines that hold only "%"; documents that are empty or only whitespace are dropped. A c10::Error
/// names `dir` when it is missing or holds no document.
std::vector<std::string> read_fortune_documents(const std::string& dir);

/// The byte tokens of each split: uint8 [L], each document followed by kDocumentSeparator.
struct TextSplits {
  at::Tensor train, validation;
};
/// A seeded shuffle of the documents puts round(fraction * n) of them (at least 1, at most n - 1)
/// in validation, the rest in training; each split keeps the corpus order. Needs two documents.
TextSplits split_documents(const std::vector<std::string>& documents, double validation_fraction, uint64_t seed);

/// Bytes as tokens: int64 [n] in [0, 256).
at::Tensor encode_bytes(std::string_view text);
/// The text of byte tokens (a 1-D integer tensor with values in [0, 256)); c10::Error otherwise.
std::string decode_bytes(const at::Tensor& tokens);
/// The vocabulary's names for evaluations and confusion matrices: the printable ASCII bytes as
/// themselves, the others as \xHH.
const std::vector<std::string>& byte_names();

struct TokenLoaderOptions {
  int64_t context = 256;     // tokens per window: inputs [B, context] and targets shifted by one
  int64_t batch_size = 32;   // windows per batch
  /// Training: each epoch starts its windows at a random offset in [0, context) and visits them in
  /// a random order (both from (seed, epoch)), and drops the last incomplete batch. Evaluation:
  /// offset 0, in order, every batch kept.
  bool training = false;
  uint64_t seed = 0;
  /// At most this many windows per epoch (training: the first of the epoch's order; evaluation:
  /// the first of a seeded shuffle, the same every time); 0: all.
  int64_t max_windows = 0;
  /// Data parallelism, as LoaderOptions (shard_order).
  int64_t shard_rank = 0, shard_count = 1;
};

/// Batches of windows of a token sequence: batch.inputs int64 [b, context] and batch.labels int64
/// [b, context], the next token of each input. Window i of an epoch covers tokens [offset + i *
/// context, offset + (i + 1) * context], so an epoch predicts each token once; the tail shorter than
/// a window is left out. Every batch is a function of (seed, epoch, index): a run resumes at any
/// batch. Built on the calling thread (a gather, cheaper than any model's step).
class TokenLoader final : public BatchStream {
 public:
  /// tokens: an integer tensor [L] with values in [0, 256) (checked), held as uint8. c10::Error
  /// naming the option for a bad one, or when the tokens hold fewer than two windows (training) or
  /// one (evaluation).
  TokenLoader(at::Tensor tokens, TokenLoaderOptions options);

  int64_t batches_per_epoch() const override;
  int64_t samples_per_epoch() const override;
  int64_t num_classes() const override { return kByteVocabulary; }
  const std::vector<std::string>& class_names() const override { return byte_names(); }
  void start_epoch(int64_t epoch, int64_t first_batch = 0) override;
  std::optional<Batch> next() override;
  int64_t skipped() const override { return 0; }

  const TokenLoaderOptions& options() const { return options_; }
  /// The windows of an epoch, before sharding and max_windows.
  int64_t windows() const;

 private:
  std::vector<int64_t> window_order(int64_t epoch) const;
  at::Tensor tokens_;
  TokenLoaderOptions options_;
  int64_t samples_ = 0;  // of every epoch (this shard's, max_windows applied)
  int64_t epoch_ = 0, offset_ = 0, next_batch_ = 0;
  std::vector<int64_t> order_;
};

}  // namespace convnn::data
