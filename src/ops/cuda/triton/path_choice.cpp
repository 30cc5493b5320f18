#include "ops/cuda/triton/path_choice.h"

#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <tuple>
#include <utility>

#include "ops/checks.h"
#include "ops/cuda/triton/first_call_check.h"
#include "ops/cuda/triton/routes.h"

namespace convnn::ops::cuda::triton {
namespace {

bool fused_kernels_chosen() {
  const char* choice = std::getenv("CONVNN_CUDA_KERNELS");
  const std::string value = choice == nullptr ? "fused" : choice;
  TORCH_CHECK(value == "fused" || value == "generic", "CONVNN_CUDA_KERNELS must be 'fused' or 'generic', got '",
              value, "'");
  return value == "fused";
}

bool fused_dtype(at::ScalarType dtype) { return dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf; }

// The first-call check's answers per (device, dtype, route): run on the first call of each, then
// remembered; a failure warns once, naming the kernel, and the ATen path serves that device, dtype
// and route from then on.
struct Verified {
  std::mutex mutex;
  std::map<std::tuple<std::string, at::ScalarType, std::string>, std::optional<std::string>> failures;
};

Verified& verified() {
  static Verified* answers = new Verified();  // never destroyed: ops may run during exit
  return *answers;
}

// An interrupt (Ctrl-C, a time limit's SIGINT) or an exit raised in Python while the Python route
// compiles or runs a kernel says nothing about the kernel: it must reach the caller, and nothing be
// remembered (remembered, it sent every later call to the generic path, a benchmark's too). It
// arrives as the C++ carrier of the Python exception, whose message begins with the exception's name.
bool interrupted(const std::exception& error) {
  const std::string_view message = error.what();
  return message.rfind("KeyboardInterrupt", 0) == 0 || message.rfind("SystemExit", 0) == 0;
}

// The kernel that failed the check on `t`'s device and dtype over `route`, or nothing.
std::optional<std::string> first_call_failure(const at::Tensor& t, const Route& route) {
  auto& answers = verified();
  const auto key = std::make_tuple(t.device().str(), t.scalar_type(), route.name);
  std::lock_guard<std::mutex> lock(answers.mutex);
  const auto found = answers.failures.find(key);
  if (found != answers.failures.end()) return found->second;
  std::optional<std::string> failure;
  try {
    failure = first_call_check(t.device(), t.scalar_type(), route.run);
  } catch (const std::exception& error) {  // a kernel that does not compile, load or launch here
    if (interrupted(error)) throw;
    failure = std::string("(") + error.what() + ")";
  }
  if (failure) {
    TORCH_WARN("convnn: the fused Triton kernel ", *failure, " disagrees with the generic path on ", t.device(), " (",
               t.scalar_type(), ", ", route.name, " route); convnn uses the generic path there from now on");
  }
  answers.failures.emplace(key, failure);
  return failure;
}

// convnn::cuda_path_log's record: off until asked.
struct PathLog {
  std::mutex mutex;
  bool recording = false;
  std::vector<std::string> entries;
};

PathLog& path_log() {
  static PathLog* log = new PathLog();
  return *log;
}

void record(const char* op, const PathChoice& choice) {
  auto& log = path_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  if (log.recording) log.entries.push_back(std::string(op) + ": " + choice.why);
}

std::vector<std::string> cuda_path_log(bool recording) {
  auto& log = path_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  log.recording = recording;
  return std::exchange(log.entries, {});
}

void cuda_path_checks_reset() {
  auto& answers = verified();
  std::lock_guard<std::mutex> lock(answers.mutex);
  answers.failures.clear();
}

}  // namespace

PathRules::PathRules(const at::Tensor& first, std::initializer_list<at::Tensor> others) : first_(first) {
  if (!fused_kernels_chosen()) {
    why_not_ = "CONVNN_CUDA_KERNELS=generic";
    return;
  }
  if (!fused_dtype(first.scalar_type())) {
    why_not_ = std::string("dtype ") + c10::toString(first.scalar_type()) +
               " (the Triton kernels take float32, bfloat16 and float16)";
    return;
  }
  for (const auto& t : others) {
    if (t.defined() && t.device() != first.device()) {
      why_not_ = "tensors on more than one device (" + first.device().str() + ", " + t.device().str() + ")";
      return;
    }
  }
}

PathRules& PathRules::require(bool holds, const char* why_not) {
  if (!holds && why_not_.empty()) why_not_ = why_not;
  return *this;
}

PathChoice PathRules::choose(const char* op, const std::string& set, const std::vector<std::string>& keys) {
  PathChoice choice;
  if (why_not_.empty()) {
    if (auto route = route_for(first_, set, keys, why_not_)) {
      if (auto failure = first_call_failure(first_, *route)) {
        why_not_ = "the first-call check found the Triton kernel " + *failure + " wrong on " + first_.device().str() +
                   " (" + c10::toString(first_.scalar_type()) + ", " + route->name + " route)";
      } else {
        choice.run = route->run;
        choice.why = "Triton kernels (" + route->name + " route)";
      }
    }
  }
  if (!choice.fused()) choice.why = "ATen path: " + why_not_;
  record(op, choice);
  return choice;
}

PathChoice PathRules::choose_per_dtype(const char* op, const std::string& set,
                                       const std::vector<std::string>& (*keys_of)(at::ScalarType)) {
  const auto dtype = holds() ? first_.scalar_type() : at::kFloat;
  return choose(op, set + " " + c10::toString(dtype), keys_of(dtype));
}

bool device_value_checks() { return checks::reads_values_everywhere(); }

TORCH_LIBRARY_FRAGMENT(convnn, m) {
  // While `recording`, every choice of path on a CUDA tensor is kept ("op: why"); each call returns
  // (and forgets) those kept since the last. convnn.cuda_paths() in Python.
  m.def("cuda_path_log(bool recording) -> str[]", &cuda_path_log);
  // Forgets the first-call checks' answers, so that the next call on each device checks again
  // (after the Python package's launcher is replaced; the tests).
  m.def("_cuda_path_checks_reset() -> ()", &cuda_path_checks_reset);
}

}  // namespace convnn::ops::cuda::triton
