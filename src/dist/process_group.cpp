#include "convnn/dist/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <c10/util/Logging.h>
#include <c10/util/StringUtil.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "dist/backends.h"
#include "dist/store_socket.h"
#include "util/enum_names.h"

namespace convnn::dist {
namespace {

// c10d logs a store operation that timed out as a warning, with the C++ backtrace of the exception
// it then throws, before convnn's one-line error says the same; the join runs with c10's warnings
// off, unless the user chose c10's log level (TORCH_CPP_LOG_LEVEL), and restores the level after.
class QuietStoreWarnings {
 public:
  QuietStoreWarnings() : saved_(FLAGS_caffe2_log_level) {
    if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) FLAGS_caffe2_log_level = std::max(saved_, c10::GLOG_ERROR);
  }
  ~QuietStoreWarnings() { FLAGS_caffe2_log_level = saved_; }
  QuietStoreWarnings(const QuietStoreWarnings&) = delete;
  QuietStoreWarnings& operator=(const QuietStoreWarnings&) = delete;

 private:
  int saved_;
};

constexpr convnn::detail::NameTable<Backend, 2> kBackends{{{"gloo", Backend::Gloo}, {"nccl", Backend::Nccl}}};

using detail::FileDescriptor;
using detail::bound_store_client_sockets;
using detail::listen_on;
using detail::wait_for_store;

// ---------------------------------------------------------------------------------------------
// The environment.

std::optional<std::string> variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

int64_t integer_variable(const char* name, int64_t min, int64_t max) {
  const auto text = variable(name);
  TORCH_CHECK(text.has_value(), "the environment sets WORLD_SIZE but not ", name,
              " (a distributed run needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as torchrun sets them)");
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(*text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TORCH_CHECK(used > 0 && used == text->size() && value >= min && value <= max, name, "='", *text,
              "' must be an integer in [", min, ", ", max, "]");
  return value;
}

// c10d's errors are c10::Errors, Gloo's transport errors std::exceptions: both become one
// c10::Error that says which rank and what it was doing.
template <typename Function>
auto collective(const std::string& what, int64_t rank, int64_t world_size, Function&& function) {
  try {
    return function();
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "rank ", rank, " of ", world_size, ": ", what, " failed: ", e.msg(),
                " (another process of the group died, or did not answer within --dist-timeout)");
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "rank ", rank, " of ", world_size, ": ", what, " failed: ", e.what(),
                " (another process of the group died, or did not answer within --dist-timeout)");
  }
}

// ---------------------------------------------------------------------------------------------
// The reducer.

// DDP's bucket sizes: a small first bucket, so that the all-reduce starts early in backward.
constexpr size_t kFirstBucketBytes = size_t{1} << 20;
constexpr size_t kBucketBytes = size_t{25} << 20;

class DdpReducer final : public GradientReducer {
 public:
  DdpReducer(c10::intrusive_ptr<c10d::ProcessGroup> group, const std::vector<at::Tensor>& parameters,
             int64_t rank, int64_t world_size)
      : rank_(rank), world_size_(world_size) {
    c10d::verify_params_across_processes(group, parameters, std::nullopt);
    // As DDP: buckets in reverse order of the parameters, roughly the order backward fills them.
    auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(parameters, {kFirstBucketBytes, kBucketBytes});
    std::reverse(buckets.begin(), buckets.end());
    std::reverse(limits.begin(), limits.end());
    reducer_ = std::make_unique<c10d::Reducer>(
        parameters, std::move(buckets), std::move(group), std::vector<bool>(parameters.size(), false),
        static_cast<int64_t>(kBucketBytes), /*find_unused_parameters=*/false,
        /*gradient_as_bucket_view=*/false, std::unordered_map<size_t, std::string>{},
        static_cast<int64_t>(kFirstBucketBytes), /*skip_all_reduce_unused_params=*/false,
        /*use_python_reducer=*/false, std::vector<int64_t>(limits.begin(), limits.end()));
  }

  // Without prepare_for_backward the reducer's autograd hooks return at once: the gradients of
  // this micro-batch accumulate locally (DDP's no_sync).
  void before_forward(bool synchronise) override {
    synchronise_ = synchronise;
    if (!synchronise_) return;
    collective("rebuilding the gradient buckets", rank_, world_size_, [&] { return reducer_->rebuild_buckets(); });
    reducer_->prepare_for_forward();
  }

  void before_backward() override {
    if (synchronise_) reducer_->prepare_for_backward(std::vector<at::Tensor>{});
  }

 private:
  int64_t rank_, world_size_;
  bool synchronise_ = false;
  std::unique_ptr<c10d::Reducer> reducer_;
};

}  // namespace

std::string to_string(Backend backend) { return convnn::detail::name_of(kBackends, backend); }

const std::vector<std::string>& backend_names() { return convnn::detail::table_names<kBackends>(); }

Backend parse_backend(const std::string& name, const c10::Device& device, const std::string& argument) {
  if (name == "auto") return device.is_cuda() ? Backend::Nccl : Backend::Gloo;
  const auto& names = backend_names();
  TORCH_CHECK(std::find(names.begin(), names.end(), name) != names.end(), argument, " must be auto or one of ",
              c10::Join(", ", names), ", got '", name, "'");
  const auto backend = convnn::detail::parse_name(kBackends, name, argument.c_str());
  TORCH_CHECK(backend == Backend::Gloo || device.is_cuda(), argument, " nccl needs a CUDA device, got ",
              device.str(), " (gloo runs on the CPU)");
  return backend;
}

std::optional<Environment> environment_from_variables() {
  if (!variable("WORLD_SIZE")) return std::nullopt;
  Environment e;
  e.world_size = integer_variable("WORLD_SIZE", 1, 1 << 20);
  e.rank = integer_variable("RANK", 0, e.world_size - 1);
  e.local_rank = variable("LOCAL_RANK") ? integer_variable("LOCAL_RANK", 0, e.world_size - 1) : 0;
  const auto address = variable("MASTER_ADDR");
  TORCH_CHECK(address.has_value() && !address->empty(),
              "the environment sets WORLD_SIZE but not MASTER_ADDR (the rendezvous host, as torchrun sets it)");
  e.master_addr = *address;
  e.master_port = integer_variable("MASTER_PORT", 1, 65535);
  e.agent_store = variable("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  e.restart_count = variable("TORCHELASTIC_RESTART_COUNT").value_or("0");
  return e;
}

struct ProcessGroup::State {
  int64_t rank = 0, world_size = 1;
  Backend backend = Backend::Gloo;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
};

ProcessGroup::ProcessGroup(std::unique_ptr<State> state) : state_(std::move(state)) {}
ProcessGroup::~ProcessGroup() = default;

std::unique_ptr<ProcessGroup> ProcessGroup::join(const Environment& e, Backend backend,
                                                 std::chrono::milliseconds timeout) {
  auto state = std::make_unique<State>();
  state->rank = e.rank;
  state->world_size = e.world_size;
  state->backend = backend;
  const auto where = e.master_addr + ":" + std::to_string(e.master_port);
  const QuietStoreWarnings quiet;
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(e.master_port);
    // torchrun's agent already serves the store on MASTER_PORT: then every rank is a client.
    options.isServer = !e.agent_store && e.rank == 0;
    options.numWorkers = static_cast<size_t>(e.world_size);
    options.waitWorkers = false;
    options.timeout = timeout;
    const auto port = static_cast<uint16_t>(e.master_port);
    FileDescriptor listener;
    if (options.isServer) {
      listener = listen_on(e.master_addr, port, timeout);
      if (listener.get() >= 0) {
        // c10d's server owns (and closes) the descriptor it is given: it gets a duplicate, and
        // convnn closes its own once the store is built, or when the error leaves this block.
        const int duplicate = ::fcntl(listener.get(), F_DUPFD_CLOEXEC, 0);
        TORCH_CHECK(duplicate >= 0, "cannot duplicate the store's socket: ", std::strerror(errno));
        options.masterListenFd = duplicate;
      }
    } else {
      wait_for_store(e.master_addr, port, timeout);
    }
    auto tcp = c10::make_intrusive<c10d::TCPStore>(e.master_addr, options);
    listener.reset();
    TORCH_CHECK(bound_store_client_sockets(port, timeout) >= 1, "found no socket of the store's client to bound");
    state->store = c10::make_intrusive<c10d::PrefixStore>("convnn/" + e.restart_count, tcp);
    state->group = c10::make_intrusive<c10d::ProcessGroup>(state->store, e.rank, e.world_size);
    const auto type = c10::DeviceType::CPU;
    if (backend == Backend::Gloo) {
      state->group->setBackend(type, c10d::ProcessGroup::BackendType::GLOO,
                               make_gloo_backend(state->store, e.rank, e.world_size, timeout));
      state->group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
    } else {
      state->group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL,
                               make_nccl_backend(state->store, e.rank, e.world_size, timeout));
      state->group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
    }
  } catch (const std::exception& error) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
    TORCH_CHECK(false, "rank ", e.rank, " of ", e.world_size, " could not join the process group at ", where,
                " within ", timeout.count() / 1000.0, " s (--dist-timeout): ",
                c10_error ? c10_error->msg() : error.what());
  }
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(std::move(state)));
}

int64_t ProcessGroup::rank() const { return state_->rank; }
int64_t ProcessGroup::world_size() const { return state_->world_size; }
Backend ProcessGroup::backend() const { return state_->backend; }

void ProcessGroup::broadcast_from_main(const std::vector<at::Tensor>& tensors) {
  for (const auto& tensor : tensors) {
    std::vector<at::Tensor> one{tensor};
    collective("broadcast from rank 0", rank(), world_size(), [&] { return state_->group->broadcast(one)->wait(); });
  }
}

void ProcessGroup::all_reduce_sum(const at::Tensor& tensor) {
  std::vector<at::Tensor> one{tensor};
  collective("all-reduce", rank(), world_size(), [&] { return state_->group->allreduce(one)->wait(); });
}

void ProcessGroup::all_reduce_max(const at::Tensor& tensor) {
  std::vector<at::Tensor> one{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  collective("all-reduce (max)", rank(), world_size(), [&] { return state_->group->allreduce(one, options)->wait(); });
}

void ProcessGroup::barrier() {
  collective("barrier", rank(), world_size(), [&] { return state_->group->barrier()->wait(); });
}

std::string ProcessGroup::share_from_main(const std::string& name, const std::string& value) {
  // Two broadcasts (the length, then the bytes) rather than the store: the group's collectives
  // fail after its timeout when a peer stops answering, but c10d's store reads do not once the
  // store's process stops (store_socket.h). NCCL broadcasts CUDA tensors only.
  const auto device = state_->backend == Backend::Nccl ? c10::Device(c10::DeviceType::CUDA) : c10::Device(c10::kCPU);
  const auto on_device = at::TensorOptions().device(device);
  return collective("sharing '" + name + "'", rank(), world_size(), [&] {
    std::vector<at::Tensor> length{at::full({1}, is_main() ? static_cast<int64_t>(value.size()) : 0,
                                            on_device.dtype(at::kLong))};
    state_->group->broadcast(length)->wait();
    const int64_t size = length[0].item<int64_t>();
    auto bytes = at::empty({size}, at::TensorOptions().dtype(at::kByte));
    if (is_main()) std::copy(value.begin(), value.end(), bytes.data_ptr<uint8_t>());
    std::vector<at::Tensor> shared{bytes.to(device)};
    state_->group->broadcast(shared)->wait();
    const auto received = shared[0].cpu();
    const auto* first = received.data_ptr<uint8_t>();
    return std::string(first, first + size);
  });
}

std::unique_ptr<GradientReducer> ProcessGroup::gradient_reducer(const std::vector<at::Tensor>& parameters) {
  return collective("checking that every rank has the same model", rank(), world_size(),
                    [&] { return std::make_unique<DdpReducer>(state_->group, parameters, rank(), world_size()); });
}

}  // namespace convnn::dist
