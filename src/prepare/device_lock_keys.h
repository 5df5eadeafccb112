// The lock keys (PrepareLocks) of what a call changes: every PCI function it binds or restores,
// the parent of every mdev, the VF of every vGPU and its PF (two vGPUs of one GPU are never
// changed at once: prepare, unprepare and recovery alike). A call takes them all before it reads or
// changes any of those devices.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "prepare/claim_record.h"
#include "prepare/device_plan.h"

namespace vfio_dra::prepare {

// The keys of what a record holds (for unprepare, recovery, and a prepare of a recorded claim).
void AddDeviceKeys(const ClaimRecord& record, std::set<std::string>& keys);
// The keys of what a plan changes.
void AddDeviceKeys(const std::vector<PlannedDevice>& plan, std::set<std::string>& keys);

}  // namespace vfio_dra::prepare
