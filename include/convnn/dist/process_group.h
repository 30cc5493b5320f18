#pragma once
// Data-parallel training across processes on PyTorch's distributed engine, c10d: a TCPStore
// rendezvous, Gloo (CPU) or NCCL (CUDA) collectives, and DDP's bucketed gradient Reducer. This
// header hides c10d's, so that only src/dist/ compiles against them (and Gloo's headers).
//
// A process joins the group torchrun describes in its environment (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT); without WORLD_SIZE it is a single-process run, with no group.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace convnn::dist {

enum class Backend { Gloo, Nccl };
std::string to_string(Backend backend);
/// The backends' names in enum order (gloo, nccl): the one table that parse_backend and to_string
/// read. A command line adds "auto".
const std::vector<std::string>& backend_names();
/// A name of backend_names(); "auto": NCCL for a CUDA device, Gloo otherwise (c10::Error naming
/// `argument` for another name, or NCCL for a device that is not CUDA).
Backend parse_backend(const std::string& name, const c10::Device& device, const std::string& argument);

/// What torchrun (or a launcher like it) tells each process.
struct Environment {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  std::string master_addr;
  int64_t master_port = 0;
  bool agent_store = false;     // TORCHELASTIC_USE_AGENT_STORE: torchrun's agent hosts the store
  std::string restart_count;    // TORCHELASTIC_RESTART_COUNT: keys of a restarted group kept apart
};

/// The environment's group, or nullopt without WORLD_SIZE. A variable that is missing or malformed
/// when WORLD_SIZE is set is a c10::Error naming it, its value and the rule.
std::optional<Environment> environment_from_variables();

class GradientReducer;

/// A joined process group. Every collective blocks until it completes, and fails (c10::Error)
/// when a peer dies (at once where the transport sees it go) or after the group's timeout.
class ProcessGroup {
 public:
  /// Connects to the store at MASTER_ADDR:MASTER_PORT and joins; a rendezvous that does not
  /// complete within `timeout` is a c10::Error naming the address, also where something accepts
  /// connections on that port and never answers. Rank 0's store (unless torchrun's agent serves
  /// it) listens on MASTER_ADDR's address only, or on every interface where that address is not
  /// one of this machine's.
  static std::unique_ptr<ProcessGroup> join(const Environment& environment, Backend backend,
                                            std::chrono::milliseconds timeout);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int64_t rank() const;
  int64_t world_size() const;
  Backend backend() const;
  bool is_main() const { return rank() == 0; }

  /// Rank 0's values of `tensors`, on every rank (in place).
  void broadcast_from_main(const std::vector<at::Tensor>& tensors);
  /// The sum over ranks of `tensor`, in place on every rank.
  void all_reduce_sum(const at::Tensor& tensor);
  /// The maximum over ranks of `tensor`, in place on every rank.
  void all_reduce_max(const at::Tensor& tensor);
  void barrier();
  /// Rank 0's `value` (others pass anything), on every rank; `name` names it in errors. A collective
  /// like the others (no store read after the rendezvous): bounded by the group's timeout.
  std::string share_from_main(const std::string& name, const std::string& value);

  /// DDP's reducer over `parameters` (those that require gradients, every one used by each
  /// forward): gradients averaged over ranks in buckets all-reduced while backward runs.
  std::unique_ptr<GradientReducer> gradient_reducer(const std::vector<at::Tensor>& parameters);

  struct State;

 private:
  explicit ProcessGroup(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

/// Averages gradients over the ranks while backward runs, as DistributedDataParallel does. Per
/// micro-batch: before_forward(synchronise), the forward, before_backward(), backward. Only a
/// micro-batch with synchronise = true all-reduces; the others accumulate locally (DDP's no_sync).
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  virtual void before_forward(bool synchronise) = 0;
  virtual void before_backward() = 0;
};

}  // namespace convnn::dist
