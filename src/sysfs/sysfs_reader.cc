#include "sysfs/sysfs_reader.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "base/file_io.h"

namespace vfio_dra::sysfs {

namespace {

// A path through something that is not a directory (an attribute file) does not exist either.
Error OpenError(int err, const std::string& what, const std::string& path) {
  return MakeError(err == ENOENT || err == ENOTDIR ? ErrorKind::kNotFound : ErrorKind::kUnavailable,
                   "cannot " + what + " " + path + ": " + ErrnoText(err));
}

// Reads the entries of an open directory (sorted, without . and ..) and closes it.
// The entries of `dir` (closed here), sorted; with `directories_only`, those that are directories
// themselves, not links to one.
std::vector<std::string> ReadEntries(DIR* dir, bool directories_only = false) {
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    if (directories_only && entry->d_type != DT_DIR) {
      struct stat st {};
      // A file system that does not give the type (DT_UNKNOWN) is asked.
      if (entry->d_type != DT_UNKNOWN ||
          ::fstatat(::dirfd(dir), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
          !S_ISDIR(st.st_mode)) {
        continue;
      }
    }
    names.push_back(name);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

std::string BaseName(const std::string& target) {
  const size_t slash = target.find_last_of('/');
  return slash == std::string::npos ? target : target.substr(slash + 1);
}

}  // namespace

SysfsDir::~SysfsDir() {
  if (fd_ >= 0) ::close(fd_);
}

Result<std::string> SysfsDir::Read(const std::string& name) const {
  const int fd = ::openat(fd_, name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return OpenError(errno, "open", Path(name));
  std::string out;
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return OpenError(err, "read", Path(name));
    }
    out.append(buf, static_cast<size_t>(n));
    // sysfs returns a whole attribute in one read; a short read of a regular file means EOF too.
    if (static_cast<size_t>(n) < sizeof buf) break;
    if (out.size() > (64u << 10)) {
      ::close(fd);
      return MakeError(ErrorKind::kInvalidArgument, Path(name) + " is larger than 64 KiB");
    }
  }
  ::close(fd);
  return out;
}

Result<std::string> SysfsDir::LinkBaseName(const std::string& name) const {
  char buf[PATH_MAX];
  const ssize_t n = ::readlinkat(fd_, name.c_str(), buf, sizeof buf - 1);
  if (n < 0) return OpenError(errno, "read link", Path(name));
  return BaseName(std::string(buf, static_cast<size_t>(n)));
}

bool SysfsDir::Exists(const std::string& name) const {
  struct stat st {};
  return ::fstatat(fd_, name.c_str(), &st, 0) == 0;
}

Result<std::vector<std::string>> SysfsDir::List(const std::string& name) const {
  const int fd = ::openat(fd_, name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return OpenError(errno, "list", Path(name));
  DIR* dir = ::fdopendir(fd);
  if (dir == nullptr) {
    const int err = errno;
    ::close(fd);
    return OpenError(err, "list", Path(name));
  }
  return ReadEntries(dir);
}

SysfsReader::SysfsReader(std::string root) : root_(std::move(root)) {
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  char* real = ::realpath(root_.c_str(), nullptr);
  real_root_ = real != nullptr ? real : root_;
  ::free(real);  // NOLINT(cppcoreguidelines-no-malloc): realpath allocates with malloc
}

Result<SysfsDir> SysfsReader::OpenDir(const std::string& relative) const {
  const std::string path = Path(relative);
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return OpenError(errno, "open", path);
  return SysfsDir(fd, path);
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
  return BaseName(*target);
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
  const std::string& root = real_root_;
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
    return OpenError(errno, "list", path);
  }
  return ReadEntries(dir);
}

Result<std::vector<std::string>> SysfsReader::ListDirectories(const std::string& relative) const {
  const std::string path = Path(relative);
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return OpenError(errno, "list", path);
  return ReadEntries(dir, /*directories_only=*/true);
}

bool SysfsReader::Exists(const std::string& relative) const {
  struct stat st {};
  return ::stat(Path(relative).c_str(), &st) == 0;
}

bool SysfsReader::IsDirectory(const std::string& relative) const {
  struct stat st {};
  return ::stat(Path(relative).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace vfio_dra::sysfs
