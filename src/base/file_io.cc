#include "base/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string_view>

namespace vfio_dra {

Status EnsureDirectory(const std::string& dir) {
  // Called before every spec and metadata write: one stat when the directory is there, as it
  // nearly always is.
  struct stat existing {};
  if (::stat(dir.c_str(), &existing) == 0 && S_ISDIR(existing.st_mode)) return Status::Ok();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return MakeError(ErrorKind::kUnavailable,
                     "cannot create directory " + dir + ": " + ec.message());
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return MakeError(ErrorKind::kUnavailable, dir + " is not a directory");
  }
  return Status::Ok();
}

std::string ErrnoText(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

Result<std::string> ReadFileToString(const std::string& path, size_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return MakeError(err == ENOENT ? ErrorKind::kNotFound : ErrorKind::kUnavailable,
                     "cannot open " + path + ": " + ErrnoText(err));
  }
  auto out = ReadOpenFileToString(fd, path, max_bytes);
  ::close(fd);
  return out;
}

Result<std::string> ReadOpenFileToString(int fd, const std::string& path, size_t max_bytes) {
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return MakeError(ErrorKind::kUnavailable, "cannot read " + path + ": " + ErrnoText(errno));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      return MakeError(ErrorKind::kInvalidArgument,
                       path + " is larger than " + std::to_string(max_bytes) + " bytes");
    }
  }
  return out;
}

std::string TemporaryFilePrefix(const std::string& file_name) { return "." + file_name + ".tmp-"; }

std::optional<std::string_view> TemporaryFileStandsFor(std::string_view entry) {
  const size_t tmp = entry.rfind(".tmp-");
  if (entry.size() < 2 || entry[0] != '.' || tmp == std::string_view::npos || tmp < 2) {
    return std::nullopt;
  }
  return entry.substr(1, tmp - 1);
}

std::pair<std::string, std::string> SplitFilePath(const std::string& path) {
  // String work, not std::filesystem::path, which splits and allocates every component of a path
  // that is written on every prepare.
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  if (slash == 0) return {"/", path.substr(1)};
  return {path.substr(0, slash), path.substr(slash + 1)};
}

Status RemoveFilesAndTemporaries(const std::string& dir, const std::vector<std::string>& names,
                                 const std::vector<FileNamePattern>& patterns) {
  if (names.empty() && patterns.empty()) return Status::Ok();
  for (const FileNamePattern& pattern : patterns) {
    if (pattern.prefix.empty()) {
      // It would match every file of the directory.
      return MakeError(ErrorKind::kInvalidArgument,
                       "refusing to remove files of " + dir + " by an empty name prefix");
    }
  }
  const auto matched = [&](std::string_view name) {
    return std::any_of(patterns.begin(), patterns.end(),
                       [&](const FileNamePattern& pattern) { return pattern.Matches(name); });
  };
  // Each file is tried even when one before it cannot be removed; the first failure is reported.
  std::optional<Error> first;
  const auto remove = [&](const std::string& path, const char* what) {
    if (::unlink(path.c_str()) == 0 || errno == ENOENT || first) return;
    const int err = errno;
    // On a read-only mount unlink says EROFS before it looks the name up, for a file that is not
    // there too: that file is gone, as wanted (an unprepare must not hang on it for ever).
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 && errno == ENOENT) return;
    first = MakeError(ErrorKind::kUnavailable, std::string(what) + path + ": " + ErrnoText(err));
  };
  for (const std::string& name : names) remove(dir + "/" + name, "cannot remove ");
  // Every unprepare lists a directory that holds a file per prepared claim, once for all of the
  // claim's files: plain readdir, which does not build and parse a std::filesystem::path per
  // entry the way directory_iterator does.
  std::unique_ptr<DIR, int (*)(DIR*)> listing(::opendir(dir.c_str()), &::closedir);
  if (listing == nullptr) {
    if (errno == ENOENT) return first ? Status(*first) : Status::Ok();
    return first
               ? Status(*first)
               : MakeError(ErrorKind::kUnavailable, "cannot list " + dir + ": " + ErrnoText(errno));
  }
  errno = 0;
  while (const dirent* entry = ::readdir(listing.get())) {
    const std::string_view name = entry->d_name;
    const auto stands_for = TemporaryFileStandsFor(name);
    if (stands_for) {
      if (std::find(names.begin(), names.end(), *stands_for) != names.end() ||
          matched(*stands_for)) {
        remove(dir + "/" + std::string(name), "cannot remove the leftover temporary file ");
      }
    } else if (entry->d_type != DT_DIR && name != "." && name != ".." && matched(name)) {
      remove(dir + "/" + std::string(name), "cannot remove ");
    }
    errno = 0;
  }
  if (errno != 0 && !first) {
    first = MakeError(ErrorKind::kUnavailable, "cannot list " + dir + ": " + ErrnoText(errno));
  }
  return first ? Status(*first) : Status::Ok();
}

Status RemoveFileAndTemporaries(const std::string& path) {
  const auto [dir, name] = SplitFilePath(path);
  return RemoveFilesAndTemporaries(dir, {name});
}

Status DiskSync::File(int fd, const std::string& path) const {
  if (file) return file(fd, path);
  if (::fsync(fd) != 0) {
    return MakeError(ErrorKind::kUnavailable, "cannot fsync " + path + ": " + ErrnoText(errno));
  }
  return Status::Ok();
}

Status DiskSync::Directory(const std::string& dir) const {
  return directory ? directory(dir) : SyncDirectory(dir);
}

Status WriteFileAtomically(const std::string& path, const std::string& contents, mode_t mode,
                           Durability durability, const DiskSync& sync) {
  const auto [dir, name] = SplitFilePath(path);
  // A fresh name per write: two writers of one file (the two instances of a rolling update
  // recording the same maxima) never share a temporary file. A process-wide counter from a random
  // start, so that no write pays for seeding a generator (calls run on short-lived threads), and
  // two processes (both pid 1 in their containers) do not walk the same names.
  static std::atomic<uint64_t> next_name{(static_cast<uint64_t>(std::random_device{}()) << 32) ^
                                         std::random_device{}()};
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 3 && fd < 0; ++attempt) {
    tmp = dir + "/" + TemporaryFilePrefix(name) +
          std::to_string(next_name.fetch_add(1, std::memory_order_relaxed) & 0xffffffffffff);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    return MakeError(ErrorKind::kUnavailable,
                     "cannot create temporary file " + tmp + ": " + ErrnoText(errno));
  }
  auto fail = [&](const std::string& what) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return Status(MakeError(ErrorKind::kUnavailable, what + " " + tmp + ": " + ErrnoText(err)));
  };
  size_t written = 0;
  while (written < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("cannot write");
    }
    written += static_cast<size_t>(n);
  }
  // The umask may have narrowed the mode given to open(); the documented mode is what counts.
  if (::fchmod(fd, mode) != 0) return fail("cannot chmod");
  if (durability != Durability::kVolatile) {
    if (Status synced = sync.File(fd, tmp); !synced.ok()) {
      ::close(fd);
      ::unlink(tmp.c_str());
      return synced;
    }
  }
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return MakeError(ErrorKind::kUnavailable, "cannot close " + tmp + ": " + ErrnoText(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return MakeError(ErrorKind::kUnavailable,
                     "cannot rename " + tmp + " to " + path + ": " + ErrnoText(err));
  }
  if (durability != Durability::kDurable) return Status::Ok();
  // The rename is durable only once the directory is: a failure here is a failure of the write.
  if (Status s = sync.Directory(dir); !s.ok()) {
    return s.error().Wrap("wrote " + path + " but cannot make it durable");
  }
  return Status::Ok();
}

Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return MakeError(ErrorKind::kUnavailable,
                     "cannot open directory " + dir + " to fsync it: " + ErrnoText(errno));
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) {
    return MakeError(ErrorKind::kUnavailable,
                     "cannot fsync directory " + dir + ": " + ErrnoText(err));
  }
  return Status::Ok();
}

}  // namespace vfio_dra
