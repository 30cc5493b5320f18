#include "local_ranks.h"

#include <arpa/inet.h>
#include <c10/util/Exception.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <optional>
#include <thread>

namespace convnn::cli {
namespace {

std::atomic<bool> interrupted{false};
extern "C" void on_parent_interrupt(int) { interrupted = true; }

// A port the kernel picks on the loopback, free when this returns (the ranks bind it moments later).
int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  TORCH_CHECK(fd >= 0, "--nproc: cannot open a socket to find a free port: ", std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                     ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  const int error = errno;
  ::close(fd);
  TORCH_CHECK(bound, "--nproc: cannot find a free loopback port: ", std::strerror(error));
  return ntohs(address.sin_port);
}

pid_t start_rank(int64_t rank, int64_t nproc, int port, const std::vector<std::string>& arguments) {
  const pid_t pid = ::fork();
  TORCH_CHECK(pid >= 0, "--nproc: cannot start rank ", rank, ": ", std::strerror(errno));
  if (pid > 0) return pid;
  // Its own process group, so that a Ctrl-C at the terminal reaches the parent alone, which passes
  // it on once (a second SIGINT would end a rank before it saves); and SIGTERM if the parent dies.
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  const auto set = [](const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); };
  set("WORLD_SIZE", std::to_string(nproc));
  set("LOCAL_WORLD_SIZE", std::to_string(nproc));
  set("RANK", std::to_string(rank));
  set("LOCAL_RANK", std::to_string(rank));
  set("MASTER_ADDR", "127.0.0.1");
  set("MASTER_PORT", std::to_string(port));
  std::vector<char*> argv;
  for (const auto& argument : arguments) argv.push_back(const_cast<char*>(argument.c_str()));
  argv.push_back(nullptr);
  ::execv("/proc/self/exe", argv.data());
  ::_exit(127);  // exec failed: the parent reports the status
}

int status_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

}  // namespace

std::vector<std::string> without_nproc(const std::vector<std::string>& arguments) {
  std::vector<std::string> kept;
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (arguments[i] == "--nproc") {
      ++i;  // and its value
    } else if (arguments[i].rfind("--nproc=", 0) != 0) {
      kept.push_back(arguments[i]);
    }
  }
  return kept;
}

int run_local_ranks(int64_t nproc, const std::vector<std::string>& arguments) {
  const int port = free_loopback_port();
  interrupted = false;
  auto previous = std::signal(SIGINT, on_parent_interrupt);
  std::vector<pid_t> running;
  for (int64_t rank = 0; rank < nproc; ++rank) running.push_back(start_rank(rank, nproc, port, arguments));
  int result = 0;
  bool forwarded = false;
  std::optional<std::chrono::steady_clock::time_point> kill_at;
  while (!running.empty()) {
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      running.erase(std::remove(running.begin(), running.end(), done), running.end());
      const int code = status_code(status);
      if (code != 0 && result == 0) {
        result = code;
        for (const pid_t pid : running) ::kill(pid, SIGTERM);
        kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      }
      continue;
    }
    if (interrupted && !forwarded) {
      for (const pid_t pid : running) ::kill(pid, SIGINT);
      forwarded = true;
    }
    if (kill_at && std::chrono::steady_clock::now() > *kill_at) {
      for (const pid_t pid : running) ::kill(pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::signal(SIGINT, previous);
  return result;
}

}  // namespace convnn::cli
