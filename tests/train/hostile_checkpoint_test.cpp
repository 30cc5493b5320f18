// Checkpoints from strangers: a file built to crash, hang or mislead the reader is one clear error
// naming the file and what is wrong, and changes nothing. Each case is one the reader accepted or
// crashed on before it was hardened (issue 24): pickles nested 100,000 deep, reference cycles,
// tuple keys, a tensor whose storage lies about its dtype, a header checksum wider than 32 bits,
// positions out of range, and optimiser state that does not fit the optimiser.
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "convnn/checkpoint/checkpoint.h"
#include "convnn/train/optim.h"
#include "data/fixtures.h"
#include "checkpoint/records.h"
#include "checkpoint/torch_file.h"

namespace convnn::train {
namespace {

using namespace convnn::checkpoint;

using Records = std::vector<std::pair<std::string, std::string>>;

// A zip laid out as torch.save lays it out, with the given records (data.pkl among them).
void write_zip(const std::string& path, const Records& records) {
  std::ofstream out(path, std::ios::binary);
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t size) {
    out.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(size));
    return size;
  });
  for (const auto& [name, bytes] : records) writer.writeRecord(name, bytes.data(), bytes.size());
  writer.writeEndOfFile();
}

// Every record of a torch.save file, `replaced` ones with new bytes.
Records records_of(const std::string& path, const Records& replaced) {
  caffe2::serialize::PyTorchStreamReader reader(path);
  Records records;
  for (const auto& name : reader.getAllRecords()) {
    // The writer adds these itself.
    if (name == "version" || name == ".data/version" || name == ".data/serialization_id") continue;
    auto [data, size] = reader.getRecord(name);
    std::string bytes(static_cast<const char*>(data.get()), size);
    for (const auto& [target, replacement] : replaced) {
      if (target == name) bytes = replacement;
    }
    records.emplace_back(name, bytes);
  }
  return records;
}

// A pickle (protocol 2) of `body` opcodes, ended by STOP.
std::string pickle_of(const std::string& body) { return std::string("\x80\x02", 2) + body + "."; }

std::string repeat(const std::string& s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

struct SmallRun {
  torch::nn::Linear linear{4, 3};
  std::unique_ptr<torch::optim::Optimizer> optimizer = make_optimizer(OptimizationConfig{}, *linear.ptr());

  SmallRun() {
    linear->forward(torch::ones({2, 4})).sum().backward();
    optimizer->step();
  }
};

// Proves the restricted unpickler bounds what a file can make it do: values nested 100,000 deep
// (lists, dicts, tuples: before, a stack overflow in destruction, hashing or conversion), a list
// that contains itself, and a tuple used as a dict key are each one error naming the file.
TEST(HostileCheckpoint, DeepNestingCyclesAndOddKeysAreErrorsNotCrashes) {
  testing::TempDir dir;
  constexpr size_t kDeep = 100000;
  const std::vector<std::tuple<std::string, std::string, std::string>> cases{
      {"deep-lists", repeat("]", kDeep) + repeat("a", kDeep - 1), "nested more than 64 levels"},
      {"deep-dicts", "}" + repeat(std::string("X\x01\x00\x00\x00k}", 7), kDeep) + repeat("s", kDeep),
       "nested more than 64 levels"},
      {"deep-tuples", ")" + repeat("\x85", kDeep), "nested more than 64 levels"},
      {"self-reference", std::string("]q\x00h\x00" "a", 6), "reference cycle"},
      {"mutual-reference", std::string("]q\x00]q\x01h\x00" "ah\x01" "a", 12), "reference cycle"},
      {"tuple-key", "})))\x87N" "s", "a dict key of type Tuple"},
  };
  for (const auto& [name, body, message] : cases) {
    SCOPED_TRACE(name);
    const auto path = dir.file(name + ".pt");
    write_zip(path, {{"data.pkl", pickle_of(body)}});
    testing::expect_error([&] { read_torch_file(path); }, path, message);
    SmallRun run;
    testing::expect_error([&] { load_checkpoint(path, *run.linear.ptr(), nullptr); }, path, message);
  }
}

// Proves nesting within the cap still reads: the limit refuses only what no checkpoint holds.
TEST(HostileCheckpoint, NestingUpToTheCapReads) {
  testing::TempDir dir;
  const auto path = dir.file("nested-64.pt");
  write_zip(path, {{"data.pkl", pickle_of(repeat("]", 64) + repeat("a", 63))}});
  auto value = read_torch_file(path);
  int depth = 0;
  while (value.isList()) {
    ++depth;
    value = value.toListRef().empty() ? c10::IValue() : value.toListRef()[0];
  }
  EXPECT_EQ(depth, 64);
  write_zip(path, {{"data.pkl", pickle_of(repeat("]", 65) + repeat("a", 64))}});
  testing::expect_error([&] { read_torch_file(path); }, path, "nested more than 64 levels");
}

// An empty list inside `levels` tuples, each holding the one inside it twice (memoised, so the file
// is a few hundred bytes): 2^(levels + 1) - 1 values once shared references are expanded.
std::string doubling_tuples(int levels) {
  std::string body = std::string("]q\x00", 3);  // the innermost value, memo 0
  for (int level = 1; level <= levels; ++level) {
    const char previous = static_cast<char>(level - 1), current = static_cast<char>(level);
    body += std::string("h") + previous + "\x86q" + current;  // (it, it) from the memo, memoised in turn
  }
  return body;
}

// Proves a file whose values share references is bounded by what they expand to (at 26 levels, 2^27
// values: before, `convnn eval` grew to 5.9 GB and died in std::terminate), refused while reading
// in a few KB of memory, and that data expanding to less than the budget still reads.
TEST(HostileCheckpoint, SharedReferencesAreBoundedByWhatTheyExpandTo) {
  testing::TempDir dir;
  for (const int levels : {20, 26, 40}) {
    SCOPED_TRACE(levels);
    const auto path = dir.file("doubling-" + std::to_string(levels) + ".pt");
    write_zip(path, {{"data.pkl", pickle_of(doubling_tuples(levels))}});
    testing::expect_error([&] { read_torch_file(path); }, path, "expand to more than 1048576");
    SmallRun run;
    testing::expect_error([&] { load_checkpoint(path, *run.linear.ptr(), nullptr); }, path,
                          "expand to more than 1048576");
  }
  const auto path = dir.file("doubling-16.pt");
  write_zip(path, {{"data.pkl", pickle_of(doubling_tuples(16))}});
  auto value = read_torch_file(path);
  int levels = 0;
  for (; value.isTuple(); value = value.toTupleRef().elements()[0]) ++levels;
  EXPECT_EQ(levels, 16);
}

// Proves a tensor whose storage claims another dtype of the same element size (IntStorage for a
// float weight: the bytes and so the CRC-32 unchanged) is refused by dtype, where it used to load
// as garbage weights and evaluate to a NaN loss.
TEST(HostileCheckpoint, AStorageThatLiesAboutItsDtypeIsRefused) {
  testing::TempDir dir;
  SmallRun run;
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("weight", run.linear->weight.detach().view(at::kInt));
  state.insert("bias", run.linear->bias.detach());
  const auto path = dir.file("int-weight.pt");
  std::ofstream(path, std::ios::binary) << torch_save_bytes(state);
  const auto before = run.linear->weight.detach().clone();
  testing::expect_error([&] { load_checkpoint(path, *run.linear.ptr(), nullptr); }, path,
                        "holds 'weight' Int [3, 4] where the model has 'weight' Float [3, 4]");
  EXPECT_TRUE(torch::equal(run.linear->weight, before));
}

// A run's checkpoint rewritten with `header` changed by `edit`, its checksum recomputed (as an
// attacker would), and optionally the header's checksum record replaced.
std::string with_header(const std::string& path, const std::string& name,
                        const std::function<void(nlohmann::json&)>& edit) {
  caffe2::serialize::PyTorchStreamReader reader(path);
  auto [data, size] = reader.getRecord("convnn_header.json");
  auto header = nlohmann::json::parse(std::string(static_cast<const char*>(data.get()), size));
  edit(header);
  const auto text = header.dump();
  const auto out = std::filesystem::path(path).parent_path() / name;
  write_zip(out.string(), records_of(path, {{"convnn_header.json", text},
                                            {"convnn_header.crc32",
                                             std::to_string(detail::crc32_of(text.data(), text.size()))}}));
  return out.string();
}

// Proves every position field is checked by its rule before a run resumes from it: a step of
// -2^62 (which trained to NaN), counts out of range, an epoch past the run's, a best epoch after
// the current one; each error names the field.
TEST(HostileCheckpoint, PositionsOutOfRangeAreErrorsNamingTheField) {
  testing::TempDir dir;
  SmallRun run;
  const auto good = dir.file("good.pt");
  save_checkpoint(good, TrainConfig{}, {}, *run.linear.ptr(), *run.optimizer);
  EXPECT_NO_THROW(read_checkpoint_header(good));
  const std::vector<std::tuple<std::string, nlohmann::json, std::string>> cases{
      {"step", -(int64_t{1} << 62), "position's step is -4611686018427387904, outside [0, "},
      {"next_batch", "12", "position's next_batch is \"12\", not an integer"},
      {"samples", -1, "position's samples is -1"},
      {"correct", 5, "position's correct is 5, outside [0, 0]"},
      {"loss_sum", std::numeric_limits<double>::quiet_NaN(), "position's loss_sum is"},
      {"epoch", 1000000, "is past the run's"},
      {"best_top1", 101.0, "position's best_top1 is 101"},
      {"best_epoch", 3, "position's best_epoch is 3, outside [-1, 0]"},
  };
  for (const auto& c : cases) {
    // Named references, not a structured binding: the lambda below captures them (C++17 forbids
    // capturing bindings; Clang refuses).
    const std::string& field = std::get<0>(c);
    const nlohmann::json& value = std::get<1>(c);
    const std::string& message = std::get<2>(c);
    SCOPED_TRACE(field);
    const auto path = with_header(good, field + ".pt", [&](nlohmann::json& h) { h["position"][field] = value; });
    testing::expect_error([&] { read_checkpoint_header(path); }, path, message);
  }
}

// Proves the header's checksum must be a 32-bit value: one wider (which a cast used to truncate
// to the right value) or with trailing text is refused.
TEST(HostileCheckpoint, AHeaderChecksumWiderThan32BitsIsRefused) {
  testing::TempDir dir;
  SmallRun run;
  const auto good = dir.file("good.pt");
  save_checkpoint(good, TrainConfig{}, {}, *run.linear.ptr(), *run.optimizer);
  caffe2::serialize::PyTorchStreamReader reader(good);
  auto [data, size] = reader.getRecord("convnn_header.crc32");
  const auto crc = std::stoull(std::string(static_cast<const char*>(data.get()), size));
  for (const auto& stored : {std::to_string(crc + (uint64_t{1} << 32)), std::to_string(crc) + "x"}) {
    SCOPED_TRACE(stored);
    const auto path = dir.file("wide.pt");
    write_zip(path, records_of(good, {{"convnn_header.crc32", stored}}));
    testing::expect_error([&] { read_checkpoint_header(path); }, path, "is not a CRC-32");
  }
}

// Proves the optimiser state is plain data laid out as torch.optim's state_dict (what Python's
// AdamW loads), round-trips bitwise, and that state which does not fit the optimiser is refused
// naming the entry, before the optimiser changes.
TEST(HostileCheckpoint, OptimizerStateIsPlainDataCheckedAgainstTheOptimizer) {
  testing::TempDir dir;
  SmallRun run;
  const auto path = dir.file("run.pt");
  save_checkpoint(path, TrainConfig{}, {}, *run.linear.ptr(), *run.optimizer);
  const auto contents = read_torch_file(path).toGenericDict();
  EXPECT_EQ(contents.at("convnn_format").toInt(), 4);
  EXPECT_FALSE(contents.contains("optimizer_archive"));
  const auto optimizer = contents.at("optimizer").toGenericDict();
  const auto groups = optimizer.at("param_groups").toListRef();
  ASSERT_EQ(groups.size(), 1u);
  const auto group = groups[0].toGenericDict();
  EXPECT_TRUE(group.at("decoupled_weight_decay").toBool());  // torch.optim.AdamW's, not Adam's
  EXPECT_EQ(group.at("params").toListRef().size(), 2u);
  const auto weight_state = optimizer.at("state").toGenericDict().at(c10::IValue(int64_t{0})).toGenericDict();
  EXPECT_EQ(weight_state.at("step").toTensor().item<double>(), 1.0);
  auto& live = dynamic_cast<torch::optim::AdamWParamState&>(
      *run.optimizer->state().find(run.linear->weight.unsafeGetTensorImpl())->second);
  EXPECT_TRUE(torch::equal(weight_state.at("exp_avg").toTensor(), live.exp_avg()));

  SmallRun other;
  load_checkpoint(path, *other.linear.ptr(), other.optimizer.get());
  auto& loaded = dynamic_cast<torch::optim::AdamWParamState&>(
      *other.optimizer->state().find(other.linear->weight.unsafeGetTensorImpl())->second);
  EXPECT_TRUE(torch::equal(loaded.exp_avg_sq(), live.exp_avg_sq()));
  EXPECT_EQ(loaded.step(), live.step());

  // AdamW's state into SGD, and into AdamW over groups of other sizes (decay on weights only).
  SmallRun for_sgd;
  OptimizationConfig sgd;
  sgd.optimizer = OptimizerKind::Sgd;
  auto sgd_optimizer = make_optimizer(sgd, *for_sgd.linear.ptr());
  testing::expect_error([&] { load_checkpoint(path, *for_sgd.linear.ptr(), sgd_optimizer.get()); }, path,
                        "its optimiser state 'state[0]' holds an entry this optimiser does not have");
  OptimizationConfig two_groups;
  two_groups.decay_on = DecayOn::Weights;
  auto grouped = make_optimizer(two_groups, *for_sgd.linear.ptr());
  testing::expect_error([&] { load_checkpoint(path, *for_sgd.linear.ptr(), grouped.get()); }, path,
                        "does not hold 2 groups");
}

}  // namespace
}  // namespace convnn::train
