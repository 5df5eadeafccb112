// SysfsWriter: the one way the daemon changes the kernel's state: one value written to one sysfs
// attribute. It is an interface so that tests drive the real binding and mdev code against a
// simulated kernel. The kernel implementation opens the attribute without O_CREAT (a missing
// attribute is an error, never a new file) and writes the value with a single write(2), because a
// sysfs store handler sees every write call on its own.
//
// ProbeWritable asks whether a write could be made at all (privilege_check.h): it opens the
// attribute for writing and closes it without writing. A sysfs store handler acts only on
// write(2), so the probe changes nothing, and it sees what access(2) does not: a read-only mount
// (EROFS) and a security module's denial (EACCES under an AppArmor profile).
#pragma once

#include <string>
#include <string_view>

namespace vfio_dra::sysfs {

class SysfsWriter {
 public:
  virtual ~SysfsWriter() = default;
  // Writes `value` to the attribute at the absolute `path`; returns 0 or the errno of the failure.
  virtual int Write(const std::string& path, std::string_view value) = 0;
  // Opens the attribute at the absolute `path` for writing and closes it unwritten; returns 0 or
  // the errno of the open.
  virtual int ProbeWritable(const std::string& path) = 0;
};

class KernelSysfsWriter final : public SysfsWriter {
 public:
  int Write(const std::string& path, std::string_view value) override;
  int ProbeWritable(const std::string& path) override;
};

}  // namespace vfio_dra::sysfs
