#include "convnn/checkpoint/atomic_file.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

namespace convnn::checkpoint {
namespace {

namespace fs = std::filesystem;

std::string errno_text(int error) { return std::system_category().message(error); }

// ---------------------------------------------------------------------------------------------
// Writing a file so that a crash, a kill or a full disk leaves either the old file or the new one.

// `.<target>.tmp<pid>` beside the target.
fs::path temporary_path(const fs::path& target, pid_t pid) {
  return target.parent_path() / ("." + target.filename().string() + ".tmp" + std::to_string(pid));
}

fs::path folder_of(const fs::path& target) {
  return target.parent_path().empty() ? fs::path(".") : target.parent_path();
}

// The target and the writer's pid of a temporary file name, if it is one.
std::optional<std::pair<std::string, pid_t>> parse_temporary_name(const std::string& name) {
  const auto tmp = name.rfind(".tmp");
  if (name.size() < 2 || name[0] != '.' || tmp == std::string::npos || tmp < 2) return std::nullopt;
  const auto digits = name.substr(tmp + 4);
  // Linux pids stay below 2^22, so nine digits are plenty and cannot overflow.
  if (digits.empty() || digits.size() > 9 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  const auto pid = static_cast<pid_t>(std::stol(digits));
  if (pid <= 0) return std::nullopt;
  return std::make_pair(name.substr(1, tmp - 1), pid);
}

// EPERM means the process exists but belongs to someone else: its write may be in progress.
bool process_exists(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }


// A temporary file being written: closed, and removed unless renamed, when it goes out of scope,
// so that no failure leaves it behind.
class TemporaryFile {
 public:
  explicit TemporaryFile(fs::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    const int error = errno;
    TORCH_CHECK(fd_ >= 0, "cannot create '", path_.string(), "': ", errno_text(error));
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  ~TemporaryFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!renamed_) ::unlink(path_.c_str());
  }

  // write(2) may write less than asked (a signal, a full disk) and may be interrupted.
  void write_all(const std::string& contents) {
    size_t written = 0;
    while (written < contents.size()) {
      const ssize_t n = ::write(fd_, contents.data() + written, contents.size() - written);
      const int error = errno;
      if (n < 0 && error == EINTR) continue;
      TORCH_CHECK(n > 0, "writing '", path_.string(), "' failed after ", written, " of ",
                  contents.size(), " bytes: ", n < 0 ? errno_text(error) : "no progress");
      written += static_cast<size_t>(n);
    }
  }

  // On disk before the rename: otherwise a power cut can leave the renamed file empty.
  void sync_and_close() {
    int rc;
    do rc = ::fsync(fd_);
    while (rc != 0 && errno == EINTR);
    int error = errno;
    TORCH_CHECK(rc == 0, "cannot sync '", path_.string(), "' to disk: ", errno_text(error));
    rc = ::close(std::exchange(fd_, -1));  // not retried: Linux closes the descriptor even on EINTR
    error = errno;
    TORCH_CHECK(rc == 0, "writing '", path_.string(), "' failed at close: ", errno_text(error));
  }

  void rename_to(const fs::path& target) {
    const int rc = ::rename(path_.c_str(), target.c_str());
    const int error = errno;
    TORCH_CHECK(rc == 0, "cannot move '", path_.string(), "' to '", target.string(), "': ",
                errno_text(error));
    renamed_ = true;
  }

 private:
  fs::path path_;
  int fd_ = -1;
  bool renamed_ = false;
};

// Makes the rename itself durable. Some file systems cannot sync a folder (EINVAL); there the
// rename is as durable as they make it.
void sync_folder(const fs::path& folder, const fs::path& target) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int error = errno;
  TORCH_CHECK(fd >= 0, "cannot open folder '", folder.string(), "' to sync the rename of '",
              target.string(), "': ", errno_text(error));
  const int rc = ::fsync(fd);
  error = errno;
  ::close(fd);
  TORCH_CHECK(rc == 0 || error == EINVAL, "cannot sync folder '", folder.string(),
              "' after renaming '", target.string(), "': ", errno_text(error));
}

}  // namespace

void remove_stale_temporaries(const fs::path& folder,
                              const std::function<bool(const std::string& target)>& ours) {
  std::vector<fs::path> stale;
  std::error_code error;
  for (fs::directory_iterator it(folder.empty() ? fs::path(".") : folder, error), end; !error && it != end; it.increment(error)) {
    const auto parsed = parse_temporary_name(it->path().filename().string());
    if (parsed && ours(parsed->first) && parsed->second != ::getpid() &&
        !process_exists(parsed->second)) {
      stale.push_back(it->path());
    }
  }
  for (const auto& path : stale) fs::remove(path, error);
}

void write_file_atomically(const std::string& path, const std::string& contents) {
  const fs::path target(path);
  const auto folder = folder_of(target);
  remove_stale_temporaries(folder, [&](const std::string& name) { return name == target.filename(); });
  TemporaryFile temporary(temporary_path(target, ::getpid()));
  temporary.write_all(contents);
  temporary.sync_and_close();
  temporary.rename_to(target);
  sync_folder(folder, target);
}

}  // namespace convnn::checkpoint
