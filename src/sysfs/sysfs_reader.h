// SysfsReader: read-only access to a sysfs tree under a configurable root (--sysfs-root). Every
// path the daemon reads goes through here, relative to the root, so tests and `discover` can run
// against a fixture tree and nothing can reach the host's /sys by accident.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/result.h"

namespace vfio_dra::sysfs {

// An open sysfs directory: attributes are read relative to its descriptor, so the (long,
// symlinked) path to the device is walked once per device instead of once per attribute.
class SysfsDir {
 public:
  SysfsDir(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~SysfsDir();
  SysfsDir(SysfsDir&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) {
    other.fd_ = -1;
  }
  SysfsDir(const SysfsDir&) = delete;
  SysfsDir& operator=(const SysfsDir&) = delete;
  SysfsDir& operator=(SysfsDir&&) = delete;

  const std::string& path() const { return path_; }
  std::string Path(const std::string& name) const { return path_ + "/" + name; }
  // A small attribute (at most 64 KiB); kNotFound when absent.
  Result<std::string> Read(const std::string& name) const;
  Result<std::string> LinkBaseName(const std::string& name) const;
  bool Exists(const std::string& name) const;
  Result<std::vector<std::string>> List(const std::string& name) const;

 private:
  int fd_;
  std::string path_;
};

class SysfsReader {
 public:
  explicit SysfsReader(std::string root);

  const std::string& root() const { return root_; }
  // "<root>/<relative>"; `relative` must not start with '/'.
  std::string Path(const std::string& relative) const;

  // Reads a small attribute file (at most 64 KiB).
  Result<std::string> Read(const std::string& relative) const;
  // The target of a symlink, as stored.
  Result<std::string> ReadLink(const std::string& relative) const;
  // The last path component of a symlink's target ("driver" -> "vfio-pci").
  Result<std::string> LinkBaseName(const std::string& relative) const;
  // The canonical absolute path, relative to the root ("devices/pci0000:00/0000:00:01.0/...").
  Result<std::string> RealPath(const std::string& relative) const;
  // Entry names of a directory, sorted; kNotFound when it does not exist.
  Result<std::vector<std::string>> List(const std::string& relative) const;
  // The entries that are directories themselves (not links to one), sorted.
  Result<std::vector<std::string>> ListDirectories(const std::string& relative) const;
  bool Exists(const std::string& relative) const;
  bool IsDirectory(const std::string& relative) const;
  // Opens a directory for attribute reads relative to it.
  Result<SysfsDir> OpenDir(const std::string& relative) const;

 private:
  std::string root_;
  std::string real_root_;  // the root with symlinks resolved, for RealPath
};

}  // namespace vfio_dra::sysfs
