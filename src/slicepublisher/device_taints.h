// Device taints from what the node knows (KEP-5055), so the scheduler stops handing out a device
// a new VM would fail on, and says why. Keys are "<driver>/<cause>":
//   lost          NoSchedule  the function (or an mdev's parent) is gone from sysfs: hot-removed,
//                             or a VF whose PF lowered sriov_numvfs. Kept published, tainted,
//                             only while a prepared claim holds it; dropped once none does. Also
//                             after a restart with nothing standing (the kubelet deleted the
//                             slices), from the checkpoint's record of the device.
//   group-unsafe  NoSchedule  the device's IOMMU group gained a function the host uses: binding
//                             the group would take that function from the host. Kept published,
//                             tainted, while it was published before; prepare refuses it.
//   unhealthy     NoSchedule  fatal PCIe errors counted by AER (aer_dev_fatal) on one of its
//                             functions (the count starts again at 0 when the function is
//                             re-enumerated), or (driver-changed) a function a prepared claim
//                             holds was bound to another driver outside vfio-dra.
//   degraded      None        the PF of a VF (or vGPU VF) has its link down.
//   unmonitored   None        its AER counters exist but cannot be read.
// The plugin never sets NoExecute: evicting running VMs is the admin's decision (DeviceTaintRule).
// Invariants: at most 4 taints per device (the 1.33-1.36 limit); a taint that stays keeps the
// time it was first published; every tainted device has a reason in DesiredPool::taint_reasons.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "discovery/node_scan.h"
#include "slicepublisher/packed_device_table.h"
#include "slicepublisher/slice_model.h"

namespace vfio_dra::slicepublisher {

namespace taint {
inline constexpr char kLost[] = "lost";
inline constexpr char kGroupUnsafe[] = "group-unsafe";
inline constexpr char kUnhealthy[] = "unhealthy";
inline constexpr char kDegraded[] = "degraded";
inline constexpr char kUnmonitored[] = "unmonitored";
}  // namespace taint

// The attributes a checkpoint records of a device a prepared claim holds (as published when it
// was prepared), by attribute name.
using RecordedAttributes = std::map<std::string, AttributeValue>;

struct TaintInputs {
  std::string driver;  // the keys' prefix
  std::string now;     // RFC 3339 UTC: the time of taints first seen in this build
  // What is published now (times of standing taints, devices to keep); null before the first
  // publish.
  const PackedDeviceTable* published = nullptr;
  // The counter sets published now, by name: a kept device keeps consuming from them (null: none).
  const std::map<std::string, CounterSet>* published_sets = nullptr;
  std::set<std::string> held = {};  // names of devices that prepared claims hold
  // What the checkpoint records of held devices, by device name: a held device that is gone and
  // that nothing published has is kept from it.
  std::map<std::string, RecordedAttributes> recorded = {};
  bool effect_none = true;  // the server takes effect None (1.35+); without it, such taints
                            // are left out
};

// Adds the taints the scan shows to a device the builder made from it.
void TaintDevice(SliceDevice& device, const discovery::NodeScan& scan, const TaintInputs& inputs,
                 std::map<std::string, std::string>& reasons);

// Published devices that the scan no longer yields but that stay: tainted (lost while held,
// group-unsafe), or as they were while a prepared claim holds them (a VF the kernel is removing,
// a device the policy stopped selecting). They keep their counter consumptions as published: the
// builder keeps them where their counter sets stay published and drops them otherwise. A held
// device whose function is gone and that nothing published has (a restart after the kubelet
// deleted the slices) is kept tainted lost from its record, without counters. `built` names the
// devices the builder made.
std::vector<SliceDevice> KeptDevices(const discovery::NodeScan& scan, const TaintInputs& inputs,
                                     const std::set<std::string>& built,
                                     std::map<std::string, std::string>& reasons);

// The key's cause ("lost" for "vfio.dra.io/lost"); empty when the key is not of `driver`.
std::string TaintCause(const DeviceTaint& taint, const std::string& driver);

// RFC 3339 UTC to the second, as the API server writes metav1.Time.
std::string Rfc3339(int64_t unix_seconds);

}  // namespace vfio_dra::slicepublisher
