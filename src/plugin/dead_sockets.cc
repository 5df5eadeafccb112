#include "plugin/dead_sockets.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "base/file_io.h"

namespace vfio_dra::plugin {
namespace {

// A socket name of this driver's: `exact` (no pod UID), or `prefix`<uid>`suffix`.
struct OwnNames {
  std::string exact;
  std::string prefix;
  std::string suffix;
  bool Match(std::string_view name) const {
    if (name == exact) return true;
    return name.size() > prefix.size() + suffix.size() && name.substr(0, prefix.size()) == prefix &&
           name.substr(name.size() - suffix.size()) == suffix;
  }
};

// Whether nothing listens on the unix socket at `path`: a connect is refused. Any other outcome
// (accepted, a full backlog, no permission, a path too long) counts as alive.
bool NothingListens(const std::string& path) {
  sockaddr_un address{};
  if (path.size() >= sizeof(address.sun_path)) return false;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const bool refused =
      ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 &&
      errno == ECONNREFUSED;
  ::close(fd);
  return refused;
}

void SweepDirectory(const std::string& dir, const OwnNames& names, const SocketLayout& own,
                    std::chrono::system_clock::time_point now, std::chrono::seconds min_age,
                    DeadSocketSweep& sweep) {
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) {
    if (ec != std::errc::no_such_file_or_directory) {
      sweep.problems.push_back("cannot list " + dir + " for dead sockets: " + ec.message());
    }
    return;
  }
  // Incremented with an error code: the range-for's increment throws, and nothing here may.
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (ec) {
      sweep.problems.push_back("cannot list " + dir + " for dead sockets: " + ec.message());
      return;
    }
    const std::string name = it->path().filename().string();
    const std::string path = it->path().string();
    if (!names.Match(name) || path == own.dra_socket || path == own.registration_socket) {
      continue;
    }
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    const auto bound = std::chrono::system_clock::from_time_t(st.st_ctim.tv_sec);
    if (now - bound < min_age || !NothingListens(path)) continue;
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      sweep.problems.push_back("cannot remove the dead socket " + path + ": " + ErrnoText(errno));
      continue;
    }
    sweep.removed.push_back(path);
  }
}

}  // namespace

DeadSocketSweep RemoveDeadSockets(const SocketLayout& own, const std::string& driver_name,
                                  std::chrono::system_clock::time_point now,
                                  std::chrono::seconds min_age) {
  DeadSocketSweep sweep;
  SweepDirectory(std::filesystem::path(own.registration_socket).parent_path().string(),
                 {driver_name + "-reg.sock", driver_name + "-", "-reg.sock"}, own, now, min_age,
                 sweep);
  SweepDirectory(std::filesystem::path(own.dra_socket).parent_path().string(),
                 {"dra.sock", "dra-", ".sock"}, own, now, min_age, sweep);
  return sweep;
}

}  // namespace vfio_dra::plugin
