#include "dist/store_socket.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <netdb.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <torch/csrc/distributed/c10d/TCPStoreBackend.hpp>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>

namespace convnn::dist::detail {
namespace {

using Clock = std::chrono::steady_clock;

using Addresses = std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)>;

// getaddrinfo's TCP addresses of host:port; nullptr (and `error` set) for a temporary failure of
// the name service, a c10::Error naming the variable for a name that resolves to nothing.
Addresses resolve(const std::string& host, uint16_t port, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  const int status = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
  if (status == EAI_AGAIN) {
    error = std::string("resolving MASTER_ADDR: ") + ::gai_strerror(status);
    return Addresses(nullptr, &::freeaddrinfo);
  }
  TORCH_CHECK(status == 0, "MASTER_ADDR='", host, "' must name a host, but it does not resolve (",
              status == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(status), ")");
  return Addresses(list, &::freeaddrinfo);
}

int milliseconds_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, std::numeric_limits<int>::max()));
}

// Whether `fd` becomes ready for `events` before the deadline.
bool ready_before(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd one{fd, events, 0};
    const int status = ::poll(&one, 1, milliseconds_until(deadline));
    if (status > 0) return true;
    if (status == 0) return false;
    TORCH_CHECK(errno == EINTR, "poll on the store's connection failed: ", std::strerror(errno));
  }
}

// A connected socket to one of host:port's addresses, or none (`error` says why) if none
// accepted before the deadline.
FileDescriptor connect_before(const std::string& host, uint16_t port, Clock::time_point deadline,
                              std::string& error) {
  const auto addresses = resolve(host, port, error);
  for (const addrinfo* a = addresses.get(); a != nullptr; a = a->ai_next) {
    FileDescriptor fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) {
      error = std::string("socket: ") + std::strerror(errno);
      continue;
    }
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0) return fd;
    if (errno != EINPROGRESS) {
      error = std::strerror(errno);
      continue;
    }
    if (!ready_before(fd.get(), POLLOUT, deadline)) {
      error = "connecting timed out";
      continue;
    }
    int status = 0;
    socklen_t size = sizeof(status);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &status, &size) != 0) status = errno;
    if (status == 0) return fd;
    error = std::strerror(status);
  }
  return FileDescriptor();
}

enum class Answer { Answered, Closed };

// Sends c10d's validation and ping on `fd` and reads the answer before the deadline: Answered, or
// Closed if the other end closed (or reset) the connection first, to be tried again until the
// deadline; a c10d::Error if no answer came in time or the answer is not the nonce.
Answer ping(int fd, Clock::time_point deadline) {
  using c10d::detail::QueryType;
  const auto nonce = static_cast<uint32_t>(::getpid());
  std::array<uint8_t, 2 * (1 + sizeof(uint32_t))> query{};
  query[0] = static_cast<uint8_t>(QueryType::VALIDATE);
  std::memcpy(&query[1], &c10d::detail::validationMagicNumber, sizeof(uint32_t));
  query[5] = static_cast<uint8_t>(QueryType::PING);
  std::memcpy(&query[6], &nonce, sizeof(uint32_t));
  const auto no_answer = [&] {
    TORCH_CHECK(false, "something accepted the connection but never answered the store's ping (is MASTER_PORT "
                "held by a program other than the rendezvous store?)");
  };
  for (size_t sent = 0; sent < query.size();) {
    const auto n = ::send(fd, query.data() + sent, query.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!ready_before(fd, POLLOUT, deadline)) no_answer();
    } else {
      return Answer::Closed;
    }
  }
  uint32_t answer = 0;
  auto* bytes = reinterpret_cast<uint8_t*>(&answer);
  for (size_t received = 0; received < sizeof(answer);) {
    if (!ready_before(fd, POLLIN, deadline)) no_answer();
    const auto n = ::recv(fd, bytes + received, sizeof(answer) - received, 0);
    if (n > 0) {
      received += static_cast<size_t>(n);
    } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      return Answer::Closed;
    }
  }
  TORCH_CHECK(answer == nonce, "the server answered the store's ping with ", answer, " instead of ", nonce,
              " (is MASTER_PORT held by a program other than the rendezvous store?)");
  return Answer::Answered;
}

}  // namespace

// Returns once a store at host:port answered a ping, retrying while nothing accepts (rank 0 may
// not listen yet) until `timeout`; a c10d::Error saying what went wrong after that.
void wait_for_store(const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
  constexpr auto kRetryDelay = std::chrono::milliseconds(100);
  const auto deadline = Clock::now() + timeout;
  std::string error = "nothing accepted a connection";
  while (true) {
    const auto fd = connect_before(host, port, deadline, error);
    if (fd.get() >= 0) {
      if (ping(fd.get(), deadline) == Answer::Answered) return;
      error = "the server closed the connection without answering the store's ping";
    }
    TORCH_CHECK(Clock::now() < deadline, "no store answered (", error, ")");
    std::this_thread::sleep_for(std::min<Clock::duration>(kRetryDelay, deadline - Clock::now()));
  }
}

// A socket listening on host:port for rank 0's store to take over (TCPStoreOptions::
// masterListenFd), because c10d has no option for the address its server binds: left to itself
// it listens on every interface (IPv6 ::, dual stack). None if host is not an address of this
// machine (EADDRNOTAVAIL: a NAT's public address, a name that resolves elsewhere): then c10d
// listens on every interface, as it always did, and the other ranks can still reach it.
FileDescriptor listen_on(const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
  std::string error;
  Addresses addresses(nullptr, &::freeaddrinfo);
  const auto deadline = Clock::now() + timeout;
  while (!(addresses = resolve(host, port, error))) {
    TORCH_CHECK(Clock::now() < deadline, "cannot listen on MASTER_ADDR='", host, "': ", error);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (const addrinfo* a = addresses.get(); a != nullptr; a = a->ai_next) {
    FileDescriptor fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    TORCH_CHECK(fd.get() >= 0, "cannot create the store's socket: ", std::strerror(errno));
    const int on = 1;  // as c10d's own listener: a restarted rank 0 can bind the port in TIME_WAIT
    TORCH_CHECK(::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) == 0,
                "cannot set SO_REUSEADDR on the store's socket: ", std::strerror(errno));
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      const int bind_error = errno;
      if (bind_error == EADDRNOTAVAIL) continue;
      TORCH_CHECK(false, "cannot listen on MASTER_ADDR='", host, "' MASTER_PORT=", port, ": ",
                  std::strerror(bind_error),
                  bind_error == EADDRINUSE ? " (another program, or a previous run, holds the port)" : "");
    }
    TORCH_CHECK(::listen(fd.get(), SOMAXCONN) == 0, "cannot listen on MASTER_ADDR='", host, "' MASTER_PORT=", port,
                ": ", std::strerror(errno));
    return fd;
  }
  return FileDescriptor();
}

namespace {

// The peer's port of a connected TCP socket; 0 for anything else (not a socket, not connected).
uint16_t peer_port(int fd) {
  struct stat status {};
  if (::fstat(fd, &status) != 0 || !S_ISSOCK(status.st_mode)) return 0;
  sockaddr_storage peer{};
  socklen_t length = sizeof(peer);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0) return 0;
  if (peer.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&peer)->sin_port);
  if (peer.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&peer)->sin6_port);
  return 0;
}

}  // namespace

int bound_store_client_sockets(uint16_t port, std::chrono::milliseconds timeout) {
  struct CloseDirectory {
    void operator()(DIR* directory) const { ::closedir(directory); }
  };
  std::unique_ptr<DIR, CloseDirectory> descriptors(::opendir("/proc/self/fd"));
  TORCH_CHECK(descriptors != nullptr, "cannot list this process's descriptors (/proc/self/fd): ",
              std::strerror(errno));
  timeval limit{};
  limit.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  limit.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  int bounded = 0;
  while (const dirent* entry = ::readdir(descriptors.get())) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == ::dirfd(descriptors.get())) continue;
    if (peer_port(static_cast<int>(fd)) != port) continue;
    for (const int option : {SO_RCVTIMEO, SO_SNDTIMEO}) {
      TORCH_CHECK(::setsockopt(static_cast<int>(fd), SOL_SOCKET, option, &limit, sizeof(limit)) == 0,
                  "cannot bound the store's socket: ", std::strerror(errno));
    }
    ++bounded;
  }
  return bounded;
}

}  // namespace convnn::dist::detail
