// The text reader of the language models: fortune files to documents, the seeded document split,
// byte tokens, and the window batches (each token predicted once per epoch, any batch resumable).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "convnn/data/text.h"
#include "data/fixtures.h"
#include "support/error_message.h"

namespace convnn::data {
namespace {

using convnn::testing::error_of;
using convnn::testing::TempDir;
namespace fs = std::filesystem;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Tokens 0, 1, ..., n - 1 (mod 256): a window's start can be read off its first token.
at::Tensor counting_tokens(int64_t n) { return at::arange(n, at::kLong).remainder(256); }

std::vector<Batch> epoch(TokenLoader& loader, int64_t number, int64_t first_batch = 0) {
  loader.start_epoch(number, first_batch);
  std::vector<Batch> batches;
  while (auto batch = loader.next()) batches.push_back(*batch);
  return batches;
}

TEST(FortuneDocuments, SplitAtPercentLinesInNameOrderSkippingIndexesAndLinks) {
  TempDir dir;
  write_text(dir.file("b"), "second file\n%\n  \n%\nlast one\n");
  write_text(dir.file("a"), "first\ntwo lines\n%\nnext\n");
  write_text(dir.file("a.dat"), "strfile index: not text");
  fs::create_symlink(dir.file("a"), dir.file("a.u8"));
  const auto documents = read_fortune_documents(dir.path().string());
  ASSERT_EQ(documents.size(), 4u);  // the blank document is dropped
  EXPECT_EQ(documents[0], "first\ntwo lines\n");
  EXPECT_EQ(documents[1], "next\n");
  EXPECT_EQ(documents[2], "second file\n");
  EXPECT_EQ(documents[3], "last one\n");
}

TEST(FortuneDocuments, AMissingOrEmptyFolderIsRefusedByName) {
  TempDir dir;
  EXPECT_NE(error_of([&] { read_fortune_documents(dir.file("absent")); }).find("absent' is not a folder"),
            std::string::npos);
  write_text(dir.file("blank"), "%\n\n%\n");
  EXPECT_NE(error_of([&] { read_fortune_documents(dir.path().string()); }).find("holds no document"),
            std::string::npos);
}

TEST(SplitDocuments, EveryDocumentLandsInExactlyOneSplitTheSameForASeed) {
  std::vector<std::string> documents;
  for (int i = 0; i < 100; ++i) documents.push_back("doc" + std::to_string(i) + "\n");
  const auto a = split_documents(documents, 0.05, 7), b = split_documents(documents, 0.05, 7);
  EXPECT_TRUE(at::equal(a.train, b.train) && at::equal(a.validation, b.validation));
  const auto train = decode_bytes(a.train), validation = decode_bytes(a.validation);
  int held_out = 0;
  for (const auto& d : documents) {
    const auto entry = d + std::string(kDocumentSeparator);
    const bool in_train = train.find(entry) != std::string::npos, in_validation = validation.find(entry) != std::string::npos;
    EXPECT_NE(in_train, in_validation) << d;
    held_out += in_validation;
  }
  EXPECT_EQ(held_out, 5);
  EXPECT_FALSE(at::equal(split_documents(documents, 0.05, 8).validation, a.validation));
}

TEST(SplitDocuments, BadArgumentsAreRefusedWithTheRule) {
  EXPECT_NE(error_of([] { split_documents({"only"}, 0.1, 0); }).find("at least 2 documents"), std::string::npos);
  EXPECT_NE(error_of([] { split_documents({"a", "b"}, 1.0, 0); }).find("validation_fraction must be in (0, 1), got 1"),
            std::string::npos);
}

TEST(ByteTokens, RoundTripAnyTextIncludingUtf8) {
  const std::string text = "caf\xc3\xa9 \x00\xff!";
  const auto tokens = encode_bytes(text);
  EXPECT_EQ(tokens.scalar_type(), at::kLong);
  EXPECT_EQ(tokens.numel(), static_cast<int64_t>(text.size()));
  EXPECT_EQ(tokens[4].item<int64_t>(), 0xa9);
  EXPECT_EQ(decode_bytes(tokens), text);
  EXPECT_NE(error_of([] { decode_bytes(at::tensor({65, 256})); }).find("bytes in [0, 256), got values in [65, 256]"),
            std::string::npos);
  EXPECT_EQ(byte_names()[65], "A");
  EXPECT_EQ(byte_names()[10], "\\x0a");
}

TEST(TokenLoader, LabelsAreTheInputsShiftedByOne) {
  TokenLoaderOptions o;
  o.context = 8;
  o.batch_size = 3;
  o.training = true;
  TokenLoader loader(counting_tokens(200), o);
  for (const auto& batch : epoch(loader, 0)) {
    EXPECT_EQ(batch.inputs.sizes(), (c10::IntArrayRef{3, 8}));
    EXPECT_TRUE(at::equal(batch.labels, (batch.inputs + 1).remainder(256)));
  }
}

TEST(TokenLoader, ATrainingEpochPredictsEachTokenOfItsWindowsOnce) {
  TokenLoaderOptions o;
  o.context = 8;
  o.batch_size = 4;
  o.training = true;
  TokenLoader loader(counting_tokens(250), o);
  EXPECT_EQ(loader.windows(), (250 - 8) / 8);
  EXPECT_EQ(loader.batches_per_epoch(), loader.windows() / 4);
  std::set<int64_t> starts;
  int64_t offset = -1;
  for (const auto& batch : epoch(loader, 3)) {
    for (int64_t i = 0; i < batch.inputs.size(0); ++i) {
      const auto start = batch.inputs[i][0].item<int64_t>();
      if (offset < 0) offset = start % 8;
      EXPECT_EQ(start % 8, offset) << "every window of an epoch starts at the epoch's offset";
      EXPECT_TRUE(starts.insert(start).second) << "window at " << start << " seen twice";
    }
  }
  EXPECT_EQ(static_cast<int64_t>(starts.size()), loader.batches_per_epoch() * 4);
}

TEST(TokenLoader, EvaluationReadsTheWindowsInOrderFromTheStart) {
  TokenLoaderOptions o;
  o.context = 10;
  o.batch_size = 4;
  TokenLoader loader(counting_tokens(95), o);  // 9 windows: 3 batches, the last of 1
  const auto batches = epoch(loader, 0);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[2].inputs.size(0), 1);
  const auto all = at::cat({batches[0].inputs, batches[1].inputs, batches[2].inputs}).flatten();
  EXPECT_TRUE(at::equal(all, counting_tokens(90)));
  EXPECT_TRUE(at::equal(epoch(loader, 5)[0].inputs, batches[0].inputs)) << "evaluation is the same every epoch";
}

TEST(TokenLoader, AnEpochResumesAtAnyBatchWithTheSameBatches) {
  TokenLoaderOptions o;
  o.context = 6;
  o.batch_size = 5;
  o.training = true;
  o.seed = 11;
  TokenLoader loader(counting_tokens(400), o);
  const auto whole = epoch(loader, 2);
  const auto rest = epoch(loader, 2, 3);
  ASSERT_EQ(rest.size() + 3, whole.size());
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_TRUE(at::equal(rest[i].inputs, whole[i + 3].inputs));
  EXPECT_FALSE(at::equal(epoch(loader, 3)[0].inputs, whole[0].inputs)) << "each epoch has its own order";
}

TEST(TokenLoader, ShardsAndSubsetsSplitTheWindows) {
  TokenLoaderOptions o;
  o.context = 4;
  o.batch_size = 2;
  o.max_windows = 12;
  std::set<int64_t> seen;
  for (int64_t rank = 0; rank < 2; ++rank) {
    o.shard_rank = rank;
    o.shard_count = 2;
    TokenLoader loader(counting_tokens(200), o);
    EXPECT_EQ(loader.samples_per_epoch(), 6);
    for (const auto& batch : epoch(loader, 0)) {
      for (int64_t i = 0; i < batch.inputs.size(0); ++i) EXPECT_TRUE(seen.insert(batch.inputs[i][0].item<int64_t>()).second);
    }
  }
  EXPECT_EQ(seen.size(), 12u);
}

TEST(TokenLoader, BadOptionsAndTooFewTokensAreRefusedByName) {
  TokenLoaderOptions o;
  o.context = 0;
  EXPECT_NE(error_of([&] { TokenLoader(counting_tokens(10), o); }).find("context must be >= 1, got 0"),
            std::string::npos);
  o.context = 8;
  o.training = true;
  EXPECT_NE(error_of([&] { TokenLoader(counting_tokens(10), o); }).find("10 tokens are too few for context 8"),
            std::string::npos);
  EXPECT_NE(error_of([&] { TokenLoader(at::rand({100}), o); }).find("tokens must be a 1-D integer tensor"),
            std::string::npos);
}

}  // namespace
}  // namespace convnn::data
