// The checkpoint's record of one claim: what prepare did to the node for it (each function's
// original binding and identity, the mdevs and vGPUs it made, the VF network settings it changed,
// the CDI files it wrote) and the plan of every allocated device, enough to finish or undo the
// prepare from the record alone. Records are values: once written or parsed, a record never
// changes (a new version of the file is a new record). Also what the records say for the rest of
// the daemon: the prepared devices (health) and the functions held (discovery).
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "discovery/node_scan.h"
#include "vfio/mdev_lifecycle.h"
#include "vfio/vf_network.h"
#include "vfio/vfio_pci_binder.h"

namespace vfio_dra::prepare {

// What a PCI function is, to recognise it after a reboot (addresses can be re-enumerated).
struct PciIdentity {
  std::string vendor;  // 4 hex digits, as sysfs has them without 0x
  std::string device;
  std::string subsystem_vendor;
  std::string subsystem_device;
  bool Known() const { return !vendor.empty() && !device.empty(); }
  std::string Display() const;
  bool operator==(const PciIdentity&) const = default;
};

// A function's binding before prepare, and what the function was.
struct FunctionRecord {
  std::string address;
  std::string driver;    // empty: no driver was bound
  std::string override;  // empty: driver_override was unset
  bool was_on_vfio = false;
  PciIdentity identity;  // empty for records upgraded from version 1
  // The VFIO driver it was bound to (records written before variant drivers: vfio-pci).
  std::string vfio_driver = vfio::kVfioPciDriver;

  vfio::OriginalBinding Binding() const {
    return {address, driver, override, was_on_vfio, vfio_driver};
  }
  static FunctionRecord From(const vfio::OriginalBinding& binding, PciIdentity identity);
  bool operator==(const FunctionRecord&) const = default;
};

struct MdevRecord {
  std::string parent;
  std::string type_id;
  std::string uuid;
  bool created_by_us = false;  // only these are removed at unprepare
  bool operator==(const MdevRecord&) const = default;
};

// A vGPU on an NVIDIA vGPU VF: the type prepare sets on the VF, recorded before it is set.
struct VgpuRecord {
  std::string address;  // the VF
  int type_id = 0;
  bool created_by_us = false;  // the VF held no vGPU: only then unprepare writes 0
  PciIdentity identity;        // the VF, checked after a reboot
  // The VF's PF: every call that changes a vGPU of the GPU locks it (PrepareLocks), unprepare and
  // recovery too, when the VF may be gone. Empty in records written before it was kept.
  std::string pf;
  bool operator==(const VgpuRecord&) const = default;
};

// One allocated device: the plan (enough to prepare it again without the published slices, e.g.
// after a reboot or while the device is unpublished) and the answer given to the kubelet.
struct RecordedDevice {
  std::string request;  // as allocated: "req" or "req/sub"
  std::string pool;
  std::string device;
  std::optional<std::string> share_id;
  bool is_mdev = false;
  bool is_vgpu = false;                // a vGPU on an NVIDIA vGPU VF (`address`)
  int vgpu_type = 0;                   // vGPU: its type ID
  std::string address;                 // PCI and vGPU: the published function
  std::vector<std::string> functions;  // PCI: every function bound for it
  std::optional<int> iommu_group;      // PCI, as published
  vfio::MdevIdentity mdev;             // mdev
  bool mdev_created_by_driver = false;
  std::string iommu_interface;                       // VfioConfig.iommuInterface name
  std::map<std::string, nlohmann::json> attributes;  // for the KubeVirt metadata file
  std::vector<std::string> cdi_device_ids;           // the answer (completed claims)
  std::optional<vfio::VfLink> vf_link;               // an SR-IOV VF of a network adapter
  vfio::VfNetSettings network;                       // what prepare sets on it
  bool operator==(const RecordedDevice&) const = default;
};

// A VF's network settings before prepare changed them, recorded before they are changed.
struct VfNetworkRecord {
  std::string address;  // the VF
  vfio::VfLink link;
  vfio::VfNetSettings previous;  // as the PF's driver reported them
  vfio::VfNetSettings applied;   // what prepare sets: undoing it restores these fields
  bool operator==(const VfNetworkRecord&) const = default;
};

enum class PrepareState { kPrepareStarted, kPrepareCompleted };

struct ClaimRecord {
  std::string uid;
  std::string namespace_;
  std::string name;
  PrepareState state = PrepareState::kPrepareStarted;
  std::string boot_id;  // of the boot the record was last written in
  std::vector<FunctionRecord> functions;
  std::vector<MdevRecord> mdevs;
  std::vector<VgpuRecord> vgpus;
  std::vector<VfNetworkRecord> vf_networks;
  std::vector<std::string> cdi_files;  // file names in --cdi-dir
  std::vector<RecordedDevice> devices;
  // False for records upgraded from version 1, whose devices lack the plan: preparing them again
  // needs the published devices.
  bool replayable = true;
  std::string Display() const;  // "claim <ns>/<name> (uid <uid>)"
  bool operator==(const ClaimRecord&) const = default;
};

// The record's vGPU on the VF at `address`, or null.
const VgpuRecord* FindVgpu(const ClaimRecord& record, const std::string& address);

// Every record on disk at one moment. Records are shared with the checkpoint's parse cache and
// never change once parsed (a new version of a file is a new record), so a view costs no copies.
struct CheckpointView {
  std::map<std::string, std::shared_ptr<const ClaimRecord>> claims;
  // Claims whose record exists but cannot be used now (unreadable, of a newer version, corrupt
  // and not yet moved aside), with the reason: any of them may hold any device.
  std::map<std::string, std::string> unreadable;
  // Records moved aside or unreadable, described for the log.
  std::vector<std::string> problems;
  // Set when the directory itself could not be listed: the view is then incomplete, and nothing
  // may be concluded from a claim's absence.
  std::optional<std::string> listing_error;
  const ClaimRecord* Find(const std::string& uid) const;
};

// A device of a completed prepare and what it occupies on the node (the health stream checks it).
struct PreparedTarget {
  std::string claim;  // "<namespace>/<name>"
  std::string pool;
  std::string device;
  std::vector<std::string> functions;  // PCI: every function bound to a VFIO driver for it
  std::map<std::string, std::string> vfio_drivers;  // PCI: the VFIO driver of each function
  std::string mdev_uuid;                            // mdev
  std::string vgpu_vf;                              // vGPU: the VF, which must hold vgpu_type
  int vgpu_type = 0;
  // As published when it was prepared (RecordedDevice::attributes): what keeps a device that is
  // gone published, tainted lost, when nothing on the server has it any more.
  std::map<std::string, nlohmann::json> attributes = {};
};
std::vector<PreparedTarget> PreparedTargets(const CheckpointView& view);

// Every function a claim in the view holds: the driver it had before prepare and the VFIO driver
// it is on (discovery uses it so that what vfio-dra bound is judged by what it was).
std::map<std::string, discovery::ManagedFunction> ManagedFunctions(const CheckpointView& view);

}  // namespace vfio_dra::prepare
