#include "sysfs/bounded_reads.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>

#include "base/file_io.h"

namespace vfio_dra::sysfs {
namespace {

// What the child sends per attribute: this header, then `length` bytes of contents.
struct RecordHeader {
  uint32_t index;
  int32_t error;  // errno of the open or read; 0 when read
  uint32_t length;
};
constexpr size_t kMaxAttribute = 4096;  // sysfs hands out at most a page per attribute

// Runs in the forked child: only async-signal-safe calls, on memory the parent made before fork.
[[noreturn]] void ReadInChild(int out, const std::vector<std::string>& paths, size_t from) {
  // The caller's output (kubectl exec's stream) must not wait for a child left behind.
  const int null = ::open("/dev/null", O_RDWR);
  for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) {
    if (null < 0 || ::dup2(null, fd) < 0) ::close(fd);
  }
  if (null > STDERR_FILENO) ::close(null);
  char buffer[sizeof(RecordHeader) + kMaxAttribute];
  for (size_t i = from; i < paths.size(); ++i) {
    RecordHeader header{static_cast<uint32_t>(i), 0, 0};
    const int fd = ::open(paths[i].c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      header.error = errno;
    } else {
      const ssize_t n = ::read(fd, buffer + sizeof header, kMaxAttribute);
      if (n < 0) {
        header.error = errno;
      } else {
        header.length = static_cast<uint32_t>(n);
      }
      ::close(fd);
    }
    std::memcpy(buffer, &header, sizeof header);
    size_t left = sizeof header + header.length;
    const char* p = buffer;
    while (left > 0) {
      const ssize_t written = ::write(out, p, left);
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) ::_exit(1);
      p += written;
      left -= static_cast<size_t>(written);
    }
  }
  ::_exit(0);
}

Error ReadError(const std::string& path, int err) {
  return MakeError(err == ENOENT ? ErrorKind::kNotFound : ErrorKind::kUnavailable,
                   "cannot read " + path + ": " + ErrnoText(err));
}

}  // namespace

std::vector<Result<std::string>> ReadAttributesBounded(const SysfsReader& sysfs,
                                                       const std::vector<std::string>& relative,
                                                       std::chrono::milliseconds stall) {
  std::vector<std::string> paths;
  paths.reserve(relative.size());
  for (const std::string& r : relative) paths.push_back(sysfs.Path(r));
  std::vector<std::optional<Result<std::string>>> read(paths.size());
  size_t next = 0;  // the first attribute no child has answered for
  while (next < paths.size()) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      read[next] = MakeError(ErrorKind::kUnavailable,
                             "cannot read " + paths[next] + ": pipe: " + ErrnoText(errno));
      ++next;
      continue;
    }
    const pid_t child = ::fork();
    if (child == 0) {
      ::close(fds[0]);
      ReadInChild(fds[1], paths, next);
    }
    ::close(fds[1]);
    if (child < 0) {
      ::close(fds[0]);
      read[next] = MakeError(ErrorKind::kUnavailable,
                             "cannot read " + paths[next] + ": fork: " + ErrnoText(errno));
      ++next;
      continue;
    }
    std::string pending;
    bool stalled = false;
    // Until every attribute is answered for: end of file may come late (another thread's fork
    // can hold the pipe's write end), and the child has nothing left to block on by then.
    while (next < paths.size()) {
      pollfd ready{fds[0], POLLIN, 0};
      const int polled = ::poll(&ready, 1, static_cast<int>(stall.count()));
      if (polled < 0 && errno == EINTR) continue;
      if (polled <= 0) {  // no answer in time, or poll failed: either way, never wait for it
        stalled = true;
        break;
      }
      char chunk[8192];
      const ssize_t n = ::read(fds[0], chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // the child is done (or gone)
      pending.append(chunk, static_cast<size_t>(n));
      while (pending.size() >= sizeof(RecordHeader)) {
        RecordHeader header{};
        std::memcpy(&header, pending.data(), sizeof header);
        if (header.index >= paths.size() || header.length > kMaxAttribute) {
          pending.clear();  // not what this file's child writes: the rest of it is dropped
          break;
        }
        if (pending.size() < sizeof header + header.length) break;
        const std::string& path = paths[header.index];
        if (header.error != 0) {
          read[header.index] = ReadError(path, header.error);
        } else {
          read[header.index] = pending.substr(sizeof header, header.length);
        }
        pending.erase(0, sizeof header + header.length);
        next = header.index + 1;
      }
    }
    ::close(fds[0]);
    if (stalled) {
      read[next] = MakeError(
          ErrorKind::kDeadlineExceeded,
          "read of " + paths[next] + " did not answer within " + std::to_string(stall.count()) +
              " ms: the kernel holds the device's lock, most likely for an unbind that waits for "
              "a VM (or another process) to let go of the device");
      ++next;
      // It ends once the kernel lets go; nothing waits for it (it cannot be waited for before).
      ::kill(child, SIGKILL);
      continue;
    }
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    if (next < paths.size() && !read[next]) {
      // The child ended before answering for it: a failure of the child, not of the read.
      read[next] = MakeError(ErrorKind::kUnavailable,
                             "cannot read " + paths[next] + ": the reading process ended early");
      ++next;
    }
  }
  std::vector<Result<std::string>> out;
  out.reserve(read.size());
  for (auto& r : read) out.push_back(std::move(*r));
  return out;
}

}  // namespace vfio_dra::sysfs
