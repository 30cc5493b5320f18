#include "checkpoint/torch_file.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/ops/empty.h>
#include <c10/core/Allocator.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <vector>

namespace convnn::checkpoint {
namespace {

using torch::jit::PickleOpCode;

// ---------------------------------------------------------------------------------------------
// Reading. torch's own C++ Unpickler cannot read the state_dicts Python saves: it reads a
// collections.OrderedDict as None (it expects one only as a tensor's empty backward hooks), so
// SETITEMS on it fails. This reader takes the opcodes of pickle protocols 2 to 4 that plain data
// uses and, like torch.load(weights_only=True), only the globals that rebuild tensors and dicts.

// What a GLOBAL names; everything but plain data is refused.
enum class Callable { None, OrderedDict, RebuildTensor, RebuildParameter, StorageType };

struct Item {
  c10::IValue value;  // the data, or for StorageType the storage's ScalarType as an int
  Callable callable = Callable::None;
};

// Plain checkpoint data nests fewer than 10 levels (a dict of optimiser state per parameter in a
// dict); the cap keeps every recursion over a value (destruction, hashing, JSON conversion) far
// from the stack's end.
constexpr int kMaxNesting = 64;
// Values count as often as they are reached: a list holding one list twice counts that list twice.
// Every walk over a value (conversion to JSON, printing, comparison) visits what shared references
// expand to, so a file of a few KB could otherwise make it visit 2^40 values. A checkpoint's data
// expands to tens of thousands (a ViT-L with AdamW state: under 20,000).
constexpr uint64_t kMaxExpandedValues = uint64_t{1} << 20;
// A checkpoint's data.pkl lists its values, not their tensors' bytes: a few hundred KB for
// thousands of tensors. The cap bounds what a hostile pickle can make the reader allocate.
constexpr uint64_t kMaxPickleBytes = uint64_t{64} << 20;

// The size a record will have once read, from the zip directory, before anything is allocated:
// torch.save stores records uncompressed, so none is larger than the file, and a deflated record
// that claims more (a decompression bomb) is refused.
uint64_t record_size(caffe2::serialize::PyTorchStreamReader& reader, const std::string& record,
                     uint64_t file_bytes, const std::string& path) {
  const uint64_t size = reader.getRecordSize(record);
  TORCH_CHECK(size <= file_bytes, "'", path, "' is not a readable torch.save file: its record ", record,
              " claims ", size, " bytes, more than the file's ", file_bytes);
  return size;
}

// Whether the unpickler reads each storage's bytes (read_torch_file) or checks its record and
// stands a meta-device storage of the declared size in for it (check_torch_file).
enum class TensorBytes { Read, Skip };

class RestrictedUnpickler {
 public:
  RestrictedUnpickler(std::string path, caffe2::serialize::PyTorchStreamReader& reader, std::string pickle,
                      uint64_t file_bytes, TensorBytes tensor_bytes)
      : path_(std::move(path)), reader_(reader), pickle_(std::move(pickle)), file_bytes_(file_bytes),
        tensor_bytes_(tensor_bytes) {}

  c10::IValue run() {
    while (true) {
      TORCH_CHECK(position_ < pickle_.size(), fail_text("the pickle ends before its STOP opcode"));
      const auto opcode = static_cast<PickleOpCode>(pickle_[position_++]);
      if (opcode == PickleOpCode::STOP) break;
      step(opcode);
    }
    TORCH_CHECK(stack_.size() == 1 && stack_.back().callable == Callable::None,
                fail_text("the pickle does not end with one value"));
    return stack_.back().value;
  }

 private:
  [[nodiscard]] std::string fail_text(const std::string& why) const {
    return "'" + path_ + "' is not a readable torch.save file: " + why + " (data.pkl, byte " +
           std::to_string(position_) + ")";
  }

  template <typename T>
  T read_little_endian() {
    TORCH_CHECK(position_ + sizeof(T) <= pickle_.size(), fail_text("the pickle is truncated"));
    T value;
    std::memcpy(&value, pickle_.data() + position_, sizeof(T));  // x86-64 and aarch64: little endian
    position_ += sizeof(T);
    return value;
  }

  std::string read_bytes(uint64_t size) {
    TORCH_CHECK(size <= pickle_.size() - position_, fail_text("the pickle is truncated"));
    std::string bytes = pickle_.substr(position_, size);
    position_ += size;
    return bytes;
  }

  std::string read_line() {
    const auto end = pickle_.find('\n', position_);
    TORCH_CHECK(end != std::string::npos, fail_text("the pickle is truncated"));
    std::string line = pickle_.substr(position_, end - position_);
    position_ = end + 1;
    return line;
  }

  double read_big_endian_double() {
    auto bits = read_little_endian<uint64_t>();
    bits = __builtin_bswap64(bits);
    double value;
    std::memcpy(&value, &bits, sizeof(value));
    return value;
  }

  // LONG1: a little-endian two's-complement integer of n bytes; convnn reads those that fit 64 bits.
  int64_t read_long(size_t n) {
    TORCH_CHECK(n <= 8, fail_text("an integer wider than 64 bits"));
    const auto bytes = read_bytes(n);
    uint64_t value = 0;
    for (size_t i = 0; i < n; ++i) value |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
    if (n > 0 && n < 8 && (static_cast<uint8_t>(bytes[n - 1]) & 0x80)) value |= ~uint64_t{0} << (8 * n);
    return static_cast<int64_t>(value);
  }

  Item pop() {
    TORCH_CHECK(!stack_.empty(), fail_text("the pickle pops an empty stack"));
    Item item = std::move(stack_.back());
    stack_.pop_back();
    return item;
  }

  c10::IValue pop_data() {
    auto item = pop();
    TORCH_CHECK(item.callable == Callable::None || item.callable == Callable::StorageType,
                fail_text("a class used as a value"));
    seal(item.value);
    return item.value;
  }

  // Containers (lists, dicts, tuples) are tracked by identity: their nesting depth, and whether
  // they were used as a value. A container used as a value is complete: changing it afterwards
  // (through a memo entry) is refused, which is what a reference cycle needs, so the values this
  // reader returns are trees of bounded depth.
  struct ContainerState {
    int depth = 1;
    uint64_t expanded = 1;  // itself and everything it holds, shared references counted each time
    bool sealed = false;
  };

  static const void* identity(const c10::IValue& value) {
    return value.isList() || value.isGenericDict() || value.isTuple() ? value.internalToPointer() : nullptr;
  }

  int depth_of(const c10::IValue& value) const {
    const auto* key = identity(value);
    if (key == nullptr) return 0;
    const auto it = containers_.find(key);
    return it == containers_.end() ? 1 : it->second.depth;
  }

  uint64_t expanded_of(const c10::IValue& value) const {
    const auto* key = identity(value);
    const auto it = key == nullptr ? containers_.end() : containers_.find(key);
    return it == containers_.end() ? 1 : it->second.expanded;
  }

  void seal(const c10::IValue& value) {
    if (const auto* key = identity(value)) containers_[key].sealed = true;
  }

  // Records that `container` holds `child`: the container's depth grows to the child's plus one.
  void nest(const c10::IValue& container, const c10::IValue& child) {
    auto& state = containers_[identity(container)];
    state.depth = std::max(state.depth, depth_of(child) + 1);
    TORCH_CHECK(state.depth <= kMaxNesting,
                fail_text("values nested more than " + std::to_string(kMaxNesting) +
                          " levels deep (checkpoint data nests fewer than 10)"));
    // Each count is at most the budget, so the sum cannot wrap.
    state.expanded += expanded_of(child);
    TORCH_CHECK(state.expanded <= kMaxExpandedValues,
                fail_text("values that expand to more than " + std::to_string(kMaxExpandedValues) +
                          " through shared references (checkpoint data has tens of thousands)"));
  }

  c10::IValue new_container(c10::IValue container) {
    containers_[identity(container)] = ContainerState{};
    return container;
  }

  // The values above the last MARK, which is removed.
  std::vector<c10::IValue> pop_to_mark() {
    TORCH_CHECK(!marks_.empty() && marks_.back() <= stack_.size(), fail_text("no MARK to pop to"));
    const size_t start = marks_.back();
    marks_.pop_back();
    std::vector<c10::IValue> values;
    for (size_t i = start; i < stack_.size(); ++i) {
      TORCH_CHECK(stack_[i].callable == Callable::None || stack_[i].callable == Callable::StorageType,
                  fail_text("a class used as a value"));
      seal(stack_[i].value);
      values.push_back(stack_[i].value);
    }
    stack_.resize(start);
    return values;
  }

  void push(c10::IValue value) { stack_.push_back({std::move(value), Callable::None}); }

  c10::IValue& top_container(bool dict) {
    TORCH_CHECK(!stack_.empty() && (dict ? stack_.back().value.isGenericDict() : stack_.back().value.isList()),
                fail_text(dict ? "SETITEM on something not a dict" : "APPEND on something not a list"));
    const auto it = containers_.find(identity(stack_.back().value));
    TORCH_CHECK(it == containers_.end() || !it->second.sealed,
                fail_text("a container changed after it was used as a value (a reference cycle, "
                          "which plain data does not have)"));
    return stack_.back().value;
  }

  void append(const std::vector<c10::IValue>& values) {
    auto& container = top_container(false);
    auto list = container.toList();
    for (const auto& v : values) {
      nest(container, v);
      list.push_back(v);
    }
  }

  void set_items(const std::vector<c10::IValue>& pairs) {
    TORCH_CHECK(pairs.size() % 2 == 0, fail_text("a dict item without its value"));
    auto& container = top_container(true);
    auto dict = container.toGenericDict();
    for (size_t i = 0; i < pairs.size(); i += 2) {
      // Only the keys plain data uses: hashing any other value is a recursion the file controls.
      TORCH_CHECK(pairs[i].isString() || pairs[i].isInt(), fail_text("a dict key of type " +
                                                                     pairs[i].tagKind() +
                                                                     " (only strings and integers)"));
      nest(container, pairs[i + 1]);
      dict.insert_or_assign(pairs[i], pairs[i + 1]);
    }
  }

  void memo_put(uint64_t index) {
    TORCH_CHECK(!stack_.empty(), fail_text("memoizing an empty stack"));
    memo_[index] = stack_.back();
  }

  void memo_get(uint64_t index) {
    const auto it = memo_.find(index);
    TORCH_CHECK(it != memo_.end(), fail_text("a memo entry that was never put"));
    stack_.push_back(it->second);
  }

  void global(const std::string& module, const std::string& name) {
    Item item;
    if (module == "collections" && name == "OrderedDict") {
      item.callable = Callable::OrderedDict;
    } else if (module == "torch._utils" && name == "_rebuild_tensor_v2") {
      item.callable = Callable::RebuildTensor;
    } else if (module == "torch._utils" && name == "_rebuild_parameter") {
      item.callable = Callable::RebuildParameter;
    } else if (module == "torch" && name.size() > 7 && name.compare(name.size() - 7, 7, "Storage") == 0) {
      item.callable = Callable::StorageType;
      item.value = static_cast<int64_t>(storage_dtype(name));
    } else {
      TORCH_CHECK(false, fail_text("it names " + module + "." + name +
                                   ", which is not plain data (torch.load(weights_only=True) refuses it too)"));
    }
    stack_.push_back(std::move(item));
  }

  at::ScalarType storage_dtype(const std::string& name) {
    const auto stem = name.substr(0, name.size() - 7);
#define CONVNN_STORAGE_NAME(_, type) \
  if (stem == #type) return at::ScalarType::type;
    AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(CONVNN_STORAGE_NAME)
#undef CONVNN_STORAGE_NAME
    TORCH_CHECK(false, fail_text("unknown storage type torch." + name));
  }

  // BINPERSID ('storage', dtype, key, location, numel): the record data/<key>, on the CPU.
  c10::IValue load_storage(const c10::IValue& id) {
    TORCH_CHECK(id.isTuple(), fail_text("a persistent id that is not a tuple"));
    const auto e = id.toTupleRef().elements().vec();  // a copy: GCC misreads the inline storage's bounds
    TORCH_CHECK(e.size() == 5 && e[0].isString() && e[0].toStringRef() == "storage" && e[1].isInt() &&
                    e[2].isString() && e[4].isInt() && e[4].toInt() >= 0,
                fail_text("a persistent id that is not a storage"));
    const auto& key = e[2].toStringRef();
    const auto found = storages_.find(key);
    if (found != storages_.end()) return found->second;
    const auto dtype = static_cast<at::ScalarType>(e[1].toInt());
    const auto record = "data/" + key;
    TORCH_CHECK(reader_.hasRecord(record), fail_text("its storage record " + record + " is missing"));
    const auto item_size = static_cast<uint64_t>(c10::elementSize(dtype));
    const auto numel = static_cast<uint64_t>(e[4].toInt());
    uint64_t needed = 0;
    TORCH_CHECK(!__builtin_mul_overflow(numel, item_size, &needed),
                fail_text("record " + record + " claims " + std::to_string(numel) + " elements"));
    // The size the zip directory declares, checked before anything is allocated for it.
    const auto declared = record_size(reader_, record, file_bytes_, path_);
    TORCH_CHECK(declared == needed,
                fail_text("record " + record + " holds " + std::to_string(declared) + " bytes where its " +
                          std::to_string(numel) + " elements need " + std::to_string(needed)));
    if (tensor_bytes_ == TensorBytes::Skip) {
      // No data, the declared size: rebuild_tensor checks each tensor's extent against it as usual.
      // Resizable only because set_ on the meta device resizes unconditionally (refused otherwise,
      // even to the same size); the extent check comes first, so nothing grows past `declared`.
      at::Storage storage(c10::Storage::use_byte_size_t(), declared, c10::GetAllocator(at::kMeta),
                          /*resizable=*/true);
      auto tensor = at::empty({0}, at::TensorOptions().dtype(dtype).device(at::kMeta)).set_(storage);
      storages_.emplace(key, tensor);
      return tensor;
    }
    auto [data, size] = reader_.getRecord(record);
    TORCH_CHECK(size == needed, fail_text("record " + record + " is truncated"));
    at::Storage storage(c10::Storage::use_byte_size_t(), size, std::move(data), nullptr, false);
    auto tensor = at::empty({0}, at::TensorOptions().dtype(dtype)).set_(storage);
    storages_.emplace(key, tensor);
    return tensor;
  }

  std::vector<int64_t> int_tuple(const c10::IValue& value, const char* what) {
    TORCH_CHECK(value.isTuple(), fail_text(std::string("a tensor's ") + what + " is not a tuple"));
    std::vector<int64_t> ints;
    for (const auto& v : value.toTupleRef().elements()) {
      TORCH_CHECK(v.isInt() && v.toInt() >= 0, fail_text(std::string("a tensor's ") + what + " holds a non-size"));
      ints.push_back(v.toInt());
    }
    return ints;
  }

  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata]), its
  // extent checked against the storage, so a damaged file cannot read past it.
  c10::IValue rebuild_tensor(const std::vector<c10::IValue>& a) {
    TORCH_CHECK(a.size() >= 4 && a[0].isTensor() && a[1].isInt() && a[1].toInt() >= 0,
                fail_text("malformed _rebuild_tensor_v2 arguments"));
    const auto storage = a[0].toTensor();
    const auto sizes = int_tuple(a[2], "size"), strides = int_tuple(a[3], "stride");
    TORCH_CHECK(sizes.size() == strides.size(), fail_text("a tensor's size and stride differ in length"));
    int64_t last = a[1].toInt();
    bool empty = false;
    bool overflow = false;
    for (size_t d = 0; d < sizes.size(); ++d) {
      empty |= sizes[d] == 0;
      int64_t reach = 0;
      if (sizes[d] > 0) overflow |= __builtin_mul_overflow(sizes[d] - 1, strides[d], &reach) ||
                                    __builtin_add_overflow(last, reach, &last);
    }
    const auto available = static_cast<int64_t>(storage.storage().nbytes() / storage.element_size());
    TORCH_CHECK(empty || (!overflow && last < available), fail_text("a tensor reaches past its storage"));
    return at::empty({0}, storage.options()).set_(storage.storage(), a[1].toInt(), sizes, strides);
  }

  void reduce() {
    const auto arguments = pop_data();
    const auto callable = pop();
    TORCH_CHECK(arguments.isTuple(), fail_text("REDUCE without an argument tuple"));
    const auto& a = arguments.toTupleRef().elements();
    switch (callable.callable) {
      case Callable::OrderedDict:
        TORCH_CHECK(a.empty(), fail_text("an OrderedDict built from arguments"));
        return push(new_container(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get())));
      case Callable::RebuildTensor:
        return push(rebuild_tensor(a.vec()));
      case Callable::RebuildParameter:
        TORCH_CHECK(!a.empty() && a[0].isTensor(), fail_text("malformed _rebuild_parameter arguments"));
        return push(a[0]);
      case Callable::None:
      case Callable::StorageType:
        break;
    }
    TORCH_CHECK(false, fail_text("REDUCE on something not callable"));
  }

  // BUILD sets an object's state: the only one plain data has is a state_dict's _metadata
  // (module versions), which loading weights does not use.
  void build() {
    pop_data();
    TORCH_CHECK(!stack_.empty() && stack_.back().value.isGenericDict(),
                fail_text("BUILD on something not a dict"));
  }

  void tuple_of(size_t n) {
    TORCH_CHECK(stack_.size() >= n, fail_text("a tuple longer than the stack"));
    std::vector<c10::IValue> values(n);
    for (size_t i = n; i-- > 0;) values[i] = pop_data();
    push_tuple(std::move(values));
  }

  void push_tuple(std::vector<c10::IValue> values) {
    const auto tuple = new_container(c10::ivalue::Tuple::create(values));
    for (const auto& v : values) nest(tuple, v);
    push(tuple);
  }

  void step(PickleOpCode opcode) {
    switch (opcode) {
      case PickleOpCode::PROTO: {
        const auto version = read_little_endian<uint8_t>();
        TORCH_CHECK(version >= 2 && version <= 5, fail_text("pickle protocol " + std::to_string(version)));
        return;
      }
      case PickleOpCode::FRAME: read_little_endian<uint64_t>(); return;
      case PickleOpCode::MARK: marks_.push_back(stack_.size()); return;
      case PickleOpCode::NONE: return push(c10::IValue());
      case PickleOpCode::NEWTRUE: return push(true);
      case PickleOpCode::NEWFALSE: return push(false);
      case PickleOpCode::BININT: return push(static_cast<int64_t>(read_little_endian<int32_t>()));
      case PickleOpCode::BININT1: return push(static_cast<int64_t>(read_little_endian<uint8_t>()));
      case PickleOpCode::BININT2: return push(static_cast<int64_t>(read_little_endian<uint16_t>()));
      case PickleOpCode::LONG1: return push(read_long(read_little_endian<uint8_t>()));
      case PickleOpCode::BINFLOAT: return push(read_big_endian_double());
      case PickleOpCode::BINUNICODE: return push(read_bytes(read_little_endian<uint32_t>()));
      case PickleOpCode::SHORT_BINUNICODE: return push(read_bytes(read_little_endian<uint8_t>()));
      case PickleOpCode::BINUNICODE8: return push(read_bytes(read_little_endian<uint64_t>()));
      case PickleOpCode::EMPTY_TUPLE: return tuple_of(0);
      case PickleOpCode::TUPLE1: return tuple_of(1);
      case PickleOpCode::TUPLE2: return tuple_of(2);
      case PickleOpCode::TUPLE3: return tuple_of(3);
      case PickleOpCode::TUPLE: return push_tuple(pop_to_mark());
      case PickleOpCode::EMPTY_LIST: return push(new_container(c10::impl::GenericList(c10::AnyType::get())));
      case PickleOpCode::APPEND: return append({pop_data()});
      case PickleOpCode::APPENDS: return append(pop_to_mark());
      case PickleOpCode::EMPTY_DICT:
        return push(new_container(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get())));
      case PickleOpCode::SETITEM: {
        auto value = pop_data();
        auto key = pop_data();
        return set_items({std::move(key), std::move(value)});
      }
      case PickleOpCode::SETITEMS: return set_items(pop_to_mark());
      case PickleOpCode::BINPUT: return memo_put(read_little_endian<uint8_t>());
      case PickleOpCode::LONG_BINPUT: return memo_put(read_little_endian<uint32_t>());
      case PickleOpCode::MEMOIZE: return memo_put(memo_.size());
      case PickleOpCode::BINGET: return memo_get(read_little_endian<uint8_t>());
      case PickleOpCode::LONG_BINGET: return memo_get(read_little_endian<uint32_t>());
      case PickleOpCode::GLOBAL: {
        auto module = read_line();
        return global(module, read_line());
      }
      case PickleOpCode::STACK_GLOBAL: {
        const auto name = pop_data(), module = pop_data();
        TORCH_CHECK(name.isString() && module.isString(), fail_text("STACK_GLOBAL without two names"));
        return global(module.toStringRef(), name.toStringRef());
      }
      case PickleOpCode::REDUCE: return reduce();
      case PickleOpCode::BUILD: return build();
      case PickleOpCode::BINPERSID: return push(load_storage(pop_data()));
      default:
        TORCH_CHECK(false, fail_text("pickle opcode 0x" + fmt_hex(static_cast<uint8_t>(opcode)) +
                                     " is not one plain data uses"));
    }
  }

  static std::string fmt_hex(uint8_t byte) {
    static const char* digits = "0123456789abcdef";
    return {digits[byte >> 4], digits[byte & 15]};
  }

  std::string path_;
  caffe2::serialize::PyTorchStreamReader& reader_;
  std::string pickle_;
  uint64_t file_bytes_;
  TensorBytes tensor_bytes_;
  size_t position_ = 0;
  std::vector<Item> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Item> memo_;
  std::unordered_map<std::string, c10::IValue> storages_;
  std::unordered_map<const void*, ContainerState> containers_;
};

std::string error_text(const std::exception& e) {
  const auto* error = dynamic_cast<const c10::Error*>(&e);
  return error ? error->msg() : e.what();
}

uint64_t file_size(const std::string& path) {
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  TORCH_CHECK(!error, "'", path, "' cannot be read: ", error.message());
  return size;
}

std::unique_ptr<caffe2::serialize::PyTorchStreamReader> open_zip(const std::string& path) {
  try {
    return std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "'", path, "' is not a readable torch.save file (not a zip archive, or truncated): ",
                error_text(e));
  }
}

c10::IValue unpickle_torch_file(caffe2::serialize::PyTorchStreamReader* reader, const std::string& path,
                                uint64_t file_bytes, TensorBytes tensor_bytes) {
  std::string pickle;
  try {
    TORCH_CHECK(reader->hasRecord("data.pkl"), "it has no data.pkl record");
    if (reader->hasRecord("byteorder")) {
      auto [order, size] = reader->getRecord("byteorder");
      TORCH_CHECK(std::string(static_cast<const char*>(order.get()), size) == "little",
                  "it was written on a big-endian machine");
    }
    const auto declared = record_size(*reader, "data.pkl", file_bytes, path);
    TORCH_CHECK(declared <= kMaxPickleBytes, "its data.pkl claims ", declared, " bytes, more than the ",
                kMaxPickleBytes, " a checkpoint's list of values needs");
    auto [data, size] = reader->getRecord("data.pkl");
    pickle.assign(static_cast<const char*>(data.get()), size);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "'", path, "' is not a readable torch.save file: ", error_text(e));
  }
  RestrictedUnpickler unpickler(path, *reader, std::move(pickle), file_bytes, tensor_bytes);
  try {
    return unpickler.run();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {  // a record the zip reader cannot inflate, for instance
    TORCH_CHECK(false, "'", path, "' is not a readable torch.save file: ", e.what());
  }
}

}  // namespace

std::string torch_save_bytes(const c10::IValue& value,
                             const std::vector<std::pair<std::string, std::string>>& extra_records) {
  std::string pickle;
  // No type tags (the last argument): TorchScript's restore_type_tag is not plain data.
  torch::jit::Pickler pickler([&](const char* bytes, size_t size) { pickle.append(bytes, size); },
                              nullptr, nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::string file;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t size) {
    file.append(static_cast<const char*>(bytes), size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  const std::string byteorder = "little";  // as Python's torch.save writes
  writer.writeRecord("byteorder", byteorder.data(), byteorder.size());
  for (const auto& [name, bytes] : extra_records) writer.writeRecord(name, bytes.data(), bytes.size());
  writer.writeEndOfFile();
  return file;
}

TorchFile::TorchFile(const std::string& path) : path_(path), reader_(open_zip(path)), bytes_(file_size(path)) {}

TorchFile::~TorchFile() = default;

c10::IValue TorchFile::contents() const { return unpickle_torch_file(reader_.get(), path_, bytes_, TensorBytes::Read); }

bool TorchFile::is_torchscript_archive() const {
  try {
    return reader_->hasRecord("constants.pkl");
  } catch (const std::exception&) {
    return false;
  }
}

std::optional<std::string> TorchFile::record(const std::string& name, uint64_t max_bytes) const {
  auto* reader = reader_.get();
  const auto& path = path_;
  try {
    if (!reader->hasRecord(name)) return std::nullopt;
    const auto declared = record_size(*reader, name, bytes_, path);
    TORCH_CHECK(declared <= max_bytes, "its record ", name, " claims ", declared, " bytes, more than the ",
                max_bytes, " it may have");
    auto [data, size] = reader->getRecord(name);
    return std::string(static_cast<const char*>(data.get()), size);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "'", path, "' is not a readable torch.save file: ", error_text(e));
  }
}

c10::IValue read_torch_file(const std::string& path) { return TorchFile(path).contents(); }

void check_torch_file(const std::string& path) {
  const auto reader = open_zip(path);
  unpickle_torch_file(reader.get(), path, file_size(path), TensorBytes::Skip);
}

std::optional<std::string> read_torch_file_record(const std::string& path, const std::string& name,
                                                  uint64_t max_bytes) {
  return TorchFile(path).record(name, max_bytes);
}

bool is_torchscript_archive(const std::string& path) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    return reader.hasRecord("constants.pkl");
  } catch (const std::exception&) {
    return false;
  }
}

c10::IValue json_to_ivalue(const nlohmann::json& json) {
  switch (json.type()) {
    case nlohmann::json::value_t::null: return {};
    case nlohmann::json::value_t::boolean: return json.get<bool>();
    case nlohmann::json::value_t::number_integer: return json.get<int64_t>();
    case nlohmann::json::value_t::number_unsigned: {
      const auto value = json.get<uint64_t>();
      TORCH_CHECK(value <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "the integer ", value,
                  " does not fit a checkpoint's 64-bit signed integers");
      return static_cast<int64_t>(value);
    }
    case nlohmann::json::value_t::number_float: return json.get<double>();
    case nlohmann::json::value_t::string: return json.get<std::string>();
    case nlohmann::json::value_t::array: {
      c10::impl::GenericList list(c10::AnyType::get());
      for (const auto& item : json) list.push_back(json_to_ivalue(item));
      return list;
    }
    case nlohmann::json::value_t::object: {
      c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
      for (const auto& [key, item] : json.items()) dict.insert(key, json_to_ivalue(item));
      return dict;
    }
    case nlohmann::json::value_t::binary:
    case nlohmann::json::value_t::discarded:
      break;
  }
  TORCH_CHECK(false, "json_to_ivalue: a JSON value of type ", json.type_name());
}

nlohmann::json ivalue_to_json(const c10::IValue& value) {
  if (value.isNone()) return nullptr;
  if (value.isBool()) return value.toBool();
  if (value.isInt()) return value.toInt();
  if (value.isDouble()) return value.toDouble();
  if (value.isString()) return value.toStringRef();
  if (value.isList() || value.isTuple()) {
    auto array = nlohmann::json::array();
    const auto items = value.isList() ? value.toListRef().vec() : value.toTupleRef().elements().vec();
    for (const auto& item : items) array.push_back(ivalue_to_json(item));
    return array;
  }
  if (value.isGenericDict()) {
    auto object = nlohmann::json::object();
    for (const auto& entry : value.toGenericDict()) {
      TORCH_CHECK(entry.key().isString(), "ivalue_to_json: a dict key that is not a string");
      object[entry.key().toStringRef()] = ivalue_to_json(entry.value());
    }
    return object;
  }
  TORCH_CHECK(false, "ivalue_to_json: a value of type ", value.tagKind(), " is not JSON");
}

}  // namespace convnn::checkpoint
