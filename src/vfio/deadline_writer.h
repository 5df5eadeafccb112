// DeadlineWriter: sysfs writes that may block in the kernel (an unbind waits, uninterruptibly,
// until a VFIO user releases the device) run on their own thread and are waited for only until a
// deadline, so a stuck device fails one claim instead of hanging the kubelet's RPC and every call
// serialized behind it. A write that misses its deadline keeps running; until it returns, the same
// write is refused at once instead of piling up blocked threads.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "vfio/sysfs_writer.h"

namespace vfio_dra::vfio {

class DeadlineWriter {
 public:
  // `writer` must outlive every write started through this object, including abandoned ones
  // (in the daemon it lives for the whole process).
  explicit DeadlineWriter(SysfsWriter& writer);

  // Returns 0, the errno of the write, ETIMEDOUT when it was still blocked at the deadline, or
  // EINPROGRESS when an earlier write of the same value to `path` has not returned yet.
  int Write(const std::string& path, const std::string& value, std::chrono::milliseconds timeout);

  // True while a write of `value` to `path` that missed its deadline has not returned.
  bool Blocked(const std::string& path, const std::string& value) const;

 private:
  struct InFlight;
  using Key = std::pair<std::string, std::string>;  // path, value
  SysfsWriter& writer_;
  std::shared_ptr<std::mutex> mu_;
  std::shared_ptr<std::set<Key>> blocked_;
};

}  // namespace vfio_dra::vfio
