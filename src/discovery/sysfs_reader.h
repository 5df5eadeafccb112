// SysfsReader: read-only access to a sysfs tree under a configurable root (--sysfs-root). Every
// path the daemon reads goes through here, relative to the root, so tests and `discover` can run
// against a fixture tree and nothing can reach the host's /sys by accident.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/result.h"

namespace vfio_dra::discovery {

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
  bool Exists(const std::string& relative) const;
  bool IsDirectory(const std::string& relative) const;

 private:
  std::string root_;
};

}  // namespace vfio_dra::discovery
