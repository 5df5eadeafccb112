// ReadAttributesBounded: reads sysfs attributes whose reads may wait for the kernel's device lock
// (driver_override, sriov_numvfs, uevent) without ever hanging the caller. While a process is
// stuck unbinding a device (a VM still holds its VFIO device), such a read sleeps
// uninterruptibly in the kernel until the VM lets go: no signal ends it, and a process with a
// thread in that sleep cannot finish exiting either. So the reads run in a child process that
// shares nothing with the caller's output; the caller waits for each read at most `stall`, and a
// read that does not answer in time is reported as such and left behind in its child (killed, it
// ends once the kernel lets go). The remaining attributes are read by a new child. A child left
// behind is reaped by whoever inherits it when the caller exits: with the DaemonSet's hostPID,
// `kubectl exec ... discover` runs in the node's PID namespace, whose init reaps it.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "base/result.h"
#include "sysfs/sysfs_reader.h"

namespace vfio_dra::sysfs {

// One result per relative path, in order: the contents, kNotFound/kUnavailable as a read
// reports them, or kDeadlineExceeded for a read that did not answer within `stall`.
std::vector<Result<std::string>> ReadAttributesBounded(const SysfsReader& sysfs,
                                                       const std::vector<std::string>& relative,
                                                       std::chrono::milliseconds stall);

}  // namespace vfio_dra::sysfs
