// DeviceHolders: which processes hold a device node open, so that "the device is still in use"
// can say by whom (the VMM of a VM that is still running, a host process using the GPU). It scans
// <proc root>/<pid>/fd/* and compares the device numbers the descriptors point to (stat follows
// the link to the inode), not their paths: the daemon sees the host's /dev under --dev-root, and
// a VMM in a pod sees it under its own mounts. Processes that cannot be inspected are skipped;
// with the host's PID namespace (the DaemonSet's hostPID) every holder on the node is found.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace vfio_dra::vfio {

struct DeviceHolder {
  int pid = 0;
  std::string command;  // from /proc/<pid>/comm
};

// Processes with an open descriptor on any of the character devices `devices` (st_rdev values).
std::vector<DeviceHolder> FindDeviceHolders(const std::string& proc_root,
                                            const std::vector<dev_t>& devices);

// "held by pid 1234 (qemu-kvm), pid 99 (x)" or "no process in this PID namespace holds it".
std::string DescribeHolders(const std::vector<DeviceHolder>& holders);

}  // namespace vfio_dra::vfio
