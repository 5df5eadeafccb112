// PrepareCheckpoint: what the daemon did to the node for each claim, kept on disk so that any
// prepare can be finished or undone after a crash or a reboot. A claim goes through two phases:
// PrepareStarted is written before anything on the node is touched and holds everything needed
// to undo it (each function's original driver and driver_override, the mdevs to create); it
// becomes PrepareCompleted with the answer given to the kubelet. The file records the node's boot
// ID (after a reboot bindings and /var/run/cdi are gone) and a format version; it is replaced
// atomically (temp file, fsync, rename) with mode 0600. A file that is corrupt or of an unknown
// version is moved aside with a clear error and the daemon starts with an empty checkpoint:
// refusing to start would leave every pod on the node unable to unprepare.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "vfio/vfio_pci_binder.h"

namespace vfio_dra::plugin {

inline constexpr int kCheckpointVersion = 1;

// A function's binding before prepare (was_on_vfio: left on vfio-pci at unprepare).
using FunctionRecord = vfio::OriginalBinding;

struct MdevRecord {
  std::string parent;
  std::string type_id;
  std::string uuid;
  bool created_by_us = false;  // only these are removed at unprepare
  bool operator==(const MdevRecord&) const = default;
};

enum class PrepareState { kPrepareStarted, kPrepareCompleted };

struct ClaimRecord {
  std::string uid;
  std::string namespace_;
  std::string name;
  PrepareState state = PrepareState::kPrepareStarted;
  std::vector<FunctionRecord> functions;
  std::vector<MdevRecord> mdevs;
  std::vector<std::string> cdi_files;  // file names in --cdi-dir
  nlohmann::json response;             // the devices answered to the kubelet (completed only)
  bool operator==(const ClaimRecord&) const = default;
};

class PrepareCheckpoint {
 public:
  // Loads `path`. A missing file is an empty checkpoint; a corrupt or unknown-version file is
  // renamed to "<path>.corrupt-<unix seconds>" and reported through `problem`.
  static Result<PrepareCheckpoint> Load(const std::string& path, const std::string& boot_id,
                                        std::string* problem);

  const std::map<std::string, ClaimRecord>& claims() const { return claims_; }
  const ClaimRecord* Find(const std::string& uid) const;
  // True when the checkpoint was written during an earlier boot of the node.
  bool WrittenBeforeReboot() const {
    return !stored_boot_id_.empty() && stored_boot_id_ != boot_id_;
  }

  // Records (or replaces) a claim and writes the file before returning.
  Status Put(const ClaimRecord& record);
  // Drops a claim and writes the file; dropping an unknown claim succeeds.
  Status Remove(const std::string& uid);

 private:
  PrepareCheckpoint(std::string path, std::string boot_id)
      : path_(std::move(path)), boot_id_(std::move(boot_id)) {}
  Status Save();

  std::string path_;
  std::string boot_id_;
  std::string stored_boot_id_;
  std::map<std::string, ClaimRecord> claims_;
};

// A device of a completed prepare and what it occupies on the node. Read from the answer recorded
// with the claim; checkpoints written before "functions" and "mdevUUID" were recorded give the
// claim's functions for each PCI device.
struct PreparedTarget {
  std::string claim;  // "<namespace>/<name>"
  std::string pool;
  std::string device;
  std::vector<std::string> functions;  // PCI: every function bound to vfio-pci for it
  std::string mdev_uuid;               // mdev
};
std::vector<PreparedTarget> PreparedTargets(const PrepareCheckpoint& checkpoint);

// The kernel's boot ID (from /proc/sys/kernel/random/boot_id, or `path` for tests).
Result<std::string> ReadBootId(const std::string& path = "/proc/sys/kernel/random/boot_id");

}  // namespace vfio_dra::plugin
