// DeviceLockGate: every sysfs read or write that can take a PCI device's kernel lock goes through
// here. While an unbind waits for a VFIO user (a VM that still has the device open), the kernel
// holds the device lock, and reads and writes of the device's driver_override, bind, unbind,
// drivers_probe, sriov_numvfs and its mdevs' remove block on it without a time limit. So each
// operation runs on a thread other than the caller's (threads are reused; one stuck in the kernel
// is replaced) and is waited for only until the caller's wait ends. An
// operation that misses it keeps running, and its device is then held: every further
// lock-taking operation on that device is refused at once (whatever its driver link says: the
// kernel removes the link before it blocks) until the blocked one returns. Blocked threads never
// pile up, and the caller (the kubelet's call, the node lock) is never held beyond its deadline.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "base/elastic_thread_pool.h"
#include "base/result.h"
#include "sysfs/sysfs_writer.h"

namespace vfio_dra::vfio {

class DeviceLockGate {
 public:
  struct Registry;  // shared with the threads that run operations

  // `writer` must outlive every operation started here, including abandoned ones (in the daemon
  // it lives for the whole process).
  explicit DeviceLockGate(sysfs::SysfsWriter& writer);
  // Idle threads end; operations still running finish on their own.
  ~DeviceLockGate();
  DeviceLockGate(const DeviceLockGate&) = delete;
  DeviceLockGate& operator=(const DeviceLockGate&) = delete;

  // Writes `value` to the attribute at `path` on behalf of PCI device `device`. Ok(errno of the
  // write, 0 on success); kDeadlineExceeded when it was still blocked after `wait`; kUnavailable
  // when an earlier operation on the device is still blocked.
  Result<int> Write(const std::string& device, const std::string& path, const std::string& value,
                    std::chrono::milliseconds wait);
  // Reads the attribute at `path` on behalf of `device`, with the same rules.
  Result<std::string> Read(const std::string& device, const std::string& path,
                           std::chrono::milliseconds wait);

  // What holds `device`: "<operation> (blocked for N s)", or nothing.
  std::optional<std::string> Held(const std::string& device) const;

 private:
  // Runs `op` for `device`, waiting at most `wait`; `what` names it in messages.
  Status Run(const std::string& device, const std::string& what, std::function<void()> op,
             std::chrono::milliseconds wait);

  sysfs::SysfsWriter& writer_;
  std::shared_ptr<Registry> registry_;
  ElasticThreadPool threads_;  // runs the operations; they hold the registry themselves
};

}  // namespace vfio_dra::vfio
