#include "discovery/sysfs_reader.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "base/file_io.h"

namespace vfio_dra::discovery {

SysfsReader::SysfsReader(std::string root) : root_(std::move(root)) {
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
}

std::string SysfsReader::Path(const std::string& relative) const { return root_ + "/" + relative; }

Result<std::string> SysfsReader::Read(const std::string& relative) const {
  return ReadFileToString(Path(relative), 64 << 10);
}

Result<std::string> SysfsReader::ReadLink(const std::string& relative) const {
  char buf[PATH_MAX];
  const std::string path = Path(relative);
  const ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  if (n < 0) {
    const int err = errno;
    return MakeError(err == ENOENT ? ErrorKind::kNotFound : ErrorKind::kUnavailable,
                     "cannot read link " + path + ": " + ErrnoText(err));
  }
  return std::string(buf, static_cast<size_t>(n));
}

Result<std::string> SysfsReader::LinkBaseName(const std::string& relative) const {
  auto target = ReadLink(relative);
  if (!target.ok()) return target;
  const size_t slash = target->find_last_of('/');
  return slash == std::string::npos ? *target : target->substr(slash + 1);
}

Result<std::string> SysfsReader::RealPath(const std::string& relative) const {
  const std::string path = Path(relative);
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (resolved == nullptr) {
    const int err = errno;
    return MakeError(err == ENOENT ? ErrorKind::kNotFound : ErrorKind::kUnavailable,
                     "cannot resolve " + path + ": " + ErrnoText(err));
  }
  std::string out(resolved);
  ::free(resolved);  // NOLINT(cppcoreguidelines-no-malloc): realpath allocates with malloc
  // The root itself may be a symlink (e.g. /tmp on some systems); compare against its real path.
  char* root_real = ::realpath(root_.c_str(), nullptr);
  std::string root = root_real != nullptr ? root_real : root_;
  ::free(root_real);  // NOLINT(cppcoreguidelines-no-malloc)
  if (out.rfind(root + "/", 0) != 0) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     path + " resolves outside the sysfs root (" + out + ")");
  }
  return out.substr(root.size() + 1);
}

Result<std::vector<std::string>> SysfsReader::List(const std::string& relative) const {
  const std::string path = Path(relative);
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) {
    const int err = errno;
    return MakeError(err == ENOENT ? ErrorKind::kNotFound : ErrorKind::kUnavailable,
                     "cannot list " + path + ": " + ErrnoText(err));
  }
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

bool SysfsReader::Exists(const std::string& relative) const {
  struct stat st {};
  return ::stat(Path(relative).c_str(), &st) == 0;
}

bool SysfsReader::IsDirectory(const std::string& relative) const {
  struct stat st {};
  return ::stat(Path(relative).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace vfio_dra::discovery
