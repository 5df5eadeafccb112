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

// The accesses of one gated operation, made on the gate's thread one after the other: a bind
// that writes driver_override, unbind and bind costs one hand-over to that thread, not three.
// The operation may outlive its caller (when the kernel blocks it), so it must own what it uses;
// this object is valid for as long as it runs.
class DeviceAccess {
 public:
  struct Progress;  // shared with the caller, which names the access in flight when it gives up

  DeviceAccess(sysfs::SysfsWriter& writer, std::shared_ptr<Progress> progress)
      : writer_(writer), progress_(std::move(progress)) {}
  // What the accesses from here on are for ("unbinding 0000:3b:00.0 from ixgbe"), for messages.
  void Step(std::string purpose);
  // Writes `value` to the attribute at `path`: 0, or the write's errno.
  int Write(const std::string& path, const std::string& value);
  // Reads the attribute at `path`.
  Result<std::string> Read(const std::string& path);

 private:
  void Begin(std::string access);
  sysfs::SysfsWriter& writer_;
  std::shared_ptr<Progress> progress_;
};

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
  // Runs `operation` (its accesses to `device`, in order) on one thread, with the same rules:
  // Ok once it has returned; kDeadlineExceeded, naming the access in flight, when it was still
  // blocked after `wait` (it finishes on its own, and the device is held until it does);
  // kUnavailable when an earlier operation on the device is still blocked. What the accesses
  // returned, the operation reports through what it owns.
  // `purpose` names the operation when it is not attempted at all.
  Status Run(const std::string& device, const std::string& purpose,
             std::function<void(DeviceAccess&)> operation, std::chrono::milliseconds wait);

  // What holds `device`: "<operation> (blocked for N s)", or nothing.
  std::optional<std::string> Held(const std::string& device) const;

 private:
  sysfs::SysfsWriter& writer_;
  std::shared_ptr<Registry> registry_;
  ElasticThreadPool threads_;  // runs the operations; they hold the registry themselves
};

}  // namespace vfio_dra::vfio
