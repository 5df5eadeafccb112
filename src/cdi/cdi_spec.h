// CDI specs as container runtimes load them: only the keys of the CDI schema, the lowest
// cdiVersion the content needs (older containerd and CRI-O reject newer version strings), and
// files written atomically into the spec directory (a temp file in the same directory, fsync,
// rename), so a runtime watching the directory only ever sees complete files.
#pragma once

#include <sys/types.h>

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"

namespace vfio_dra::cdi {

struct DeviceNode {
  std::string path;       // in the container
  std::string host_path;  // empty: same as path
  // Type and numbers from sysfs; with them a runtime need not stat the host node.
  std::optional<int64_t> major;
  std::optional<int64_t> minor;
};

struct Mount {
  std::string host_path;
  std::string container_path;
  std::vector<std::string> options;
};

struct Device {
  std::string name;
  std::vector<DeviceNode> device_nodes;
  std::vector<Mount> mounts;
};

struct Spec {
  std::string kind;  // "vendor/class"
  std::vector<Device> devices;
  std::vector<DeviceNode> common_device_nodes;  // spec-level containerEdits
};

// The lowest cdiVersion that accepts `spec` (0.3.0, or 0.5.0 for host paths and device names
// starting with a digit).
std::string MinimumCdiVersion(const Spec& spec);

// Fails when the spec would be refused by the CDI loader (no devices, a device without edits,
// a malformed kind), naming what is wrong.
Status ValidateSpec(const Spec& spec);

// The spec file's text, ending in a newline.
std::string SpecText(const Spec& spec);

// "kind=name": the fully qualified CDI device ID handed to the kubelet.
std::string QualifiedDeviceId(const std::string& kind, const std::string& device_name);

// "<vendor>-<class>_<id>.json", the CDI library's transient spec name.
std::string TransientSpecFileName(const std::string& kind, const std::string& id);

// A spec directory (--cdi-dir). File names are single path components; anything else is refused.
class SpecDirectory {
 public:
  explicit SpecDirectory(std::string dir, mode_t file_mode = 0644)
      : dir_(std::move(dir)), file_mode_(file_mode) {}
  const std::string& dir() const { return dir_; }
  std::string PathOf(const std::string& file_name) const { return dir_ + "/" + file_name; }
  Status Write(const std::string& file_name, const Spec& spec) const;
  // Removing a file that does not exist succeeds. Temporary files its writes left (a process
  // killed midway) go too.
  Status Remove(const std::string& file_name) const;
  // Remove for each file, in order, and for every spec file (.json) whose name begins with one of
  // `prefixes`, with one listing of the directory for all of them. A name or prefix that is not
  // one safe file name is refused (the error says which) and the others still go.
  Status RemoveAll(const std::vector<std::string>& file_names,
                   const std::vector<std::string>& prefixes = {}) const;
  // Spec files whose names start with `prefix`, and those of which only a write's leftover
  // temporary file is there.
  Result<std::vector<std::string>> List(const std::string& prefix) const;

 private:
  std::string dir_;
  mode_t file_mode_;
};

// A safe single path component: not empty, not "." or "..", no '/', no NUL, printable ASCII,
// at most 255 bytes.
bool IsSafeFileName(const std::string& name);

}  // namespace vfio_dra::cdi
