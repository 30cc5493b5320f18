#pragma once
// The rendezvous store's sockets that convnn opens itself, around c10d's TCPStore.
//
// Why convnn talks to the store before c10d does. c10d's TCPStore client (torch 2.11) connects
// with a deadline, then sends its validation and a ping, and reads the ping's answer with a
// blocking recv that has no timeout at all (TCPStore::ping, called by the constructor; strace
// shows the recv). A process that accepts connections on MASTER_PORT and never answers (another
// service, a stopped process, a port forward to a dead host) therefore hangs every rank >= 1
// forever, whatever --dist-timeout says. c10d offers no way to put a receive timeout on its
// socket (TCPStoreOptions has none, its Socket class is not exported, and the constructor reads
// before convnn could set one on the descriptor, as it does afterwards), and running the
// constructor on a thread abandoned at the deadline would leave that thread blocked in recv
// holding a half-built store, which exit() would then race with. So a client first sends the
// same validation and ping on a socket of its own, every wait of which (connect, send, receive)
// is a poll bounded by the deadline, and hands the address to c10d only once a store answered
// with its nonce: then c10d's own ping is answered at once. The bytes are c10d's, from its header
// TCPStoreBackend.hpp (QueryType, validationMagicNumber), so they follow the torch convnn is built
// against. What remains unbounded: a store that answers this ping and hangs within the next
// milliseconds, before c10d's (only a broken TCPStore could do that).
//
// A store whose process stops answering later. c10d bounds a get or wait by the store's timeout
// only while the store's process runs (measured with torch 2.11, 2026-11-29: a wait on a store
// whose process was stopped with SIGSTOP times out its poll after the timeout, sends its "stop
// waiting", then blocks in recv for the answer for good). That happens during the rendezvous too:
// Gloo's full-mesh connect waits for each peer's address in the store, and a peer that stops
// there (or whose store stops while this rank is still connecting) left this rank blocked. So,
// once c10d's client is built, bound_store_client_sockets puts --dist-timeout on its socket's
// receives and sends (the kernel's SO_RCVTIMEO: c10d turns the EAGAIN into "Socket Timeout"); a
// reply that a running store sends never waits that long. And convnn reads the store no more once
// the group is built: ProcessGroup::share_from_main broadcasts through the group, whose
// collectives have the group's timeout. (NCCL's communicator still takes its id from the store at
// its first collective: c10d's, now bounded too, not testable here.)
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

namespace convnn::dist::detail {

/// An owned file descriptor (closed when destroyed); -1: none.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() { reset(); }
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

/// Returns once a store at host:port answered c10d's validation and ping, retrying while nothing
/// accepts (rank 0 may not listen yet) until `timeout`; a c10::Error saying what went wrong after.
void wait_for_store(const std::string& host, uint16_t port, std::chrono::milliseconds timeout);

/// Puts `timeout` on every receive and send of this process's sockets connected to port `port`
/// (c10d's store client, once its TCPStore is built): then a store operation whose server stopped
/// answering fails with c10d's "Socket Timeout" instead of blocking in recv for good. Returns how
/// many sockets it bounded.
int bound_store_client_sockets(uint16_t port, std::chrono::milliseconds timeout);

/// A socket listening on host:port for rank 0's store to take over (TCPStoreOptions::
/// masterListenFd), because c10d has no option for the address its server binds: left to itself
/// it listens on every interface. None (-1) if host is not an address of this machine (a NAT's
/// public address): then c10d listens on every interface, as it always did.
FileDescriptor listen_on(const std::string& host, uint16_t port, std::chrono::milliseconds timeout);

}  // namespace convnn::dist::detail
