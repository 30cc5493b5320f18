// The torch.save format that checkpoints use: what the writer writes, the restricted reader reads
// back exactly (the Python side of the round trip is python/tests/test_checkpoints.py), and the
// reader refuses anything but plain data, and damaged files, naming the file.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <caffe2/serialize/inline_container.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "data/fixtures.h"
#include "checkpoint/torch_file.h"

namespace convnn::train {
namespace {

using namespace convnn::checkpoint;

void write_string(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A zip as torch.save writes it, around a hand-written pickle.
std::string zip_with_pickle(const std::string& pickle) {
  std::string file;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t size) {
    file.append(static_cast<const char*>(bytes), size);
    return size;
  });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  writer.writeEndOfFile();
  return file;
}

// Proves the writer/reader pair keeps every kind of plain data and every tensor bitwise,
// including views into a shared storage, other dtypes, 0-d and empty tensors.
TEST(TorchFile, WhatIsWrittenReadsBackExactly) {
  testing::TempDir dir;
  const auto base = torch::randn({4, 6}, torch::kFloat64);
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(int64_t{-3});
  list.push_back(2.5);
  list.push_back(std::string("text"));
  list.push_back(c10::IValue());
  c10::impl::GenericDict tensors(c10::StringType::get(), c10::AnyType::get());
  tensors.insert("base", base);
  tensors.insert("column", base.select(1, 2));  // a strided view with an offset, same storage
  tensors.insert("bf16", torch::randn({3}).to(torch::kBFloat16));
  tensors.insert("count", torch::tensor(int64_t{1} << 40));
  tensors.insert("empty", torch::empty({0, 5}));
  c10::impl::GenericDict contents(c10::StringType::get(), c10::AnyType::get());
  contents.insert("list", list);
  contents.insert("tensors", tensors);
  contents.insert("flag", true);
  contents.insert("big", int64_t{1} << 62);
  const auto path = dir.file("plain.pt");
  write_string(path, torch_save_bytes(contents));

  const auto read = read_torch_file(path).toGenericDict();
  EXPECT_EQ(read.at("big").toInt(), int64_t{1} << 62);
  EXPECT_TRUE(read.at("flag").toBool());
  const auto read_list = read.at("list").toListRef();
  ASSERT_EQ(read_list.size(), 4u);
  EXPECT_EQ(read_list[0].toInt(), -3);
  EXPECT_EQ(read_list[1].toDouble(), 2.5);
  EXPECT_EQ(read_list[2].toStringRef(), "text");
  EXPECT_TRUE(read_list[3].isNone());
  const auto read_tensors = read.at("tensors").toGenericDict();
  for (const auto& item : tensors) {
    const auto& name = item.key().toStringRef();
    const auto stored = read_tensors.at(name).toTensor();
    const auto written = item.value().toTensor();
    EXPECT_EQ(stored.dtype(), written.dtype()) << name;
    EXPECT_EQ(stored.sizes(), written.sizes()) << name;
    EXPECT_TRUE(torch::equal(stored, written)) << name;
  }
  EXPECT_TRUE(read_tensors.at("base").toTensor().storage().is_alias_of(
      read_tensors.at("column").toTensor().storage()))
      << "a view was read as a copy";
}

// Proves a JSON config survives the trip through plain data unchanged, numbers keeping their kind.
TEST(TorchFile, JsonRoundTripsThroughPlainData) {
  const auto json = nlohmann::json::parse(
      R"({"a": 1, "b": 1.0, "c": [true, null, "x", -7, 0.1], "d": {"e": {}, "f": []}})");
  EXPECT_EQ(ivalue_to_json(json_to_ivalue(json)), json);
  EXPECT_TRUE(ivalue_to_json(json_to_ivalue(json)).at("b").is_number_float());
}

// Proves the reader runs no code a file names: a global other than those that rebuild tensors
// and dicts is an error naming the file and the global.
TEST(TorchFile, AGlobalThatIsNotPlainDataIsRefused) {
  testing::TempDir dir;
  const auto path = dir.file("evil.pt");
  // PROTO 2, GLOBAL os.system, the argument ("true",), REDUCE, STOP: what pickle runs as os.system.
  const auto pickle = std::string("\x80\x02" "cos\nsystem\n") + std::string("X\x04\x00\x00\x00true", 9) + "\x85" "R.";
  write_string(path, zip_with_pickle(pickle));
  testing::expect_error([&] { read_torch_file(path); }, path, "it names os.system, which is not plain data");
}

// Proves damaged pickles are errors naming the file, never a crash: truncated, a stack
// underflow, an unknown opcode, and a tensor reaching past its storage.
TEST(TorchFile, DamagedPicklesAreErrorsNamingTheFile) {
  testing::TempDir dir;
  const std::vector<std::pair<std::string, std::string>> pickles{
      {"truncated", std::string("\x80\x02}q\x00(X\x01\x00", 9)},
      {"underflow", std::string("\x80\x02s.", 4)},
      {"unknown-opcode", std::string("\x80\x02\xff.", 4)},
      {"no-stop", std::string("\x80\x02N", 3)},
  };
  for (const auto& [name, pickle] : pickles) {
    SCOPED_TRACE(name);
    const auto path = dir.file(name + ".pt");
    write_string(path, zip_with_pickle(pickle));
    testing::expect_error([&] { read_torch_file(path); }, path, "is not a readable torch.save file");
  }
  // A tensor of 8 floats whose size claims 9: its record holds fewer bytes than it reaches.
  auto bytes = torch_save_bytes(torch::arange(8, torch::kFloat));
  const std::string size_8("(K\x08t", 4), size_9("(K\x09t", 4);  // the size tuple: MARK, BININT1 8, TUPLE
  const auto at = bytes.find(size_8);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, size_8.size(), size_9);
  const auto path = dir.file("past-storage.pt");
  write_string(path, bytes);
  testing::expect_error([&] { read_torch_file(path); }, path, "reaches past its storage");
}

// Proves check_torch_file (what the Python loader runs before torch.load) refuses each file that
// read_torch_file refuses, with the same message, and passes what it reads: it reads the same
// pickle and checks each tensor against its record's declared size, only without the bytes.
TEST(TorchFile, CheckingRefusesWhatReadingRefusesWithTheSameMessage) {
  testing::TempDir dir;
  c10::impl::GenericDict good(c10::StringType::get(), c10::AnyType::get());
  const auto base = torch::randn({4, 6});
  good.insert("base", base);
  good.insert("column", base.select(1, 2));
  good.insert("empty", torch::empty({0, 5}, torch::kBFloat16));
  const auto good_path = dir.file("good.pt");
  write_string(good_path, torch_save_bytes(good));
  EXPECT_NO_THROW(check_torch_file(good_path));

  auto past_storage = torch_save_bytes(torch::arange(8, torch::kFloat));
  const std::string size_8("(K\x08t", 4), size_9("(K\x09t", 4);
  past_storage.replace(past_storage.find(size_8), size_8.size(), size_9);
  std::string deep = "\x80\x02";  // lists nested 65 deep, one more than the reader allows
  for (int i = 0; i < 65; ++i) deep += "]";
  for (int i = 0; i < 64; ++i) deep += "a";
  const std::vector<std::pair<std::string, std::string>> files{
      {"not-a-zip", "plain text"},
      {"past-storage", past_storage},
      {"unknown-opcode", zip_with_pickle(std::string("\x80\x02\xff.", 4))},
      {"os-system", zip_with_pickle(std::string("\x80\x02" "cos\nsystem\n") +
                                    std::string("X\x04\x00\x00\x00true", 9) + "\x85" "R.")},
      {"too-deep", zip_with_pickle(deep + ".")},
  };
  for (const auto& [name, bytes] : files) {
    SCOPED_TRACE(name);
    const auto path = dir.file(name + ".pt");
    write_string(path, bytes);
    const auto reading = testing::error_of([&] { read_torch_file(path); });
    EXPECT_NE(reading, "<no error>");
    EXPECT_EQ(testing::error_of([&] { check_torch_file(path); }), reading);
  }
}

}  // namespace
}  // namespace convnn::train
