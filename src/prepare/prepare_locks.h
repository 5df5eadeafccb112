// PrepareLocks: what lets claims on disjoint devices prepare and unprepare in parallel, in one
// instance and across the two instances of a rolling update, while two calls never work on one
// device at once. Three kinds of flock in <plugin-data-dir>:
//   serialize.lock           shared for the whole of every call. Versions before parallel
//                            preparation take it exclusively for each call, so an instance of
//                            such a version and one of this version never overlap.
//   prepare.lock             shared while a call decides (reads the checkpoint, takes its device
//                            locks, plans, records PrepareStarted); exclusive for start-up
//                            recovery, which so sees no decision half made.
//   devices/<address>.lock   exclusive per PCI function for as long as a call changes it: every
//                            function of a PCI device, and the parent of an mdev (so a whole GPU
//                            and its vGPUs, or two vGPUs of one GPU, are never changed at once);
//                            a parent that is not on PCI (mtty) has parent-<name>.lock.
// Invariants: while a call holds device locks it only tries others, never waits for one (a call
// that finds one busy lets all of them go, and prepare.lock, before it waits), so two calls never
// wait for each other: no deadlock. Every record that holds a device is written and removed only
// under that device's lock, so a call that holds the locks of all its devices and then reads the
// checkpoint sees every record that can clash with it, and none can appear while it works. A
// record in PrepareStarted whose device locks are free was left by a process that died (the
// kernel drops a dead holder's flocks), which is how recovery tells a crash from work in flight.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/deadline.h"
#include "base/file_lock.h"
#include "base/result.h"

namespace vfio_dra::prepare {

inline constexpr const char* kSerializeLockFile = "serialize.lock";
inline constexpr const char* kDecisionLockFile = "prepare.lock";
inline constexpr const char* kDeviceLockDirectory = "devices";

class PrepareLocks;

// The device locks one call holds. Locks are only ever tried, never waited for, while some are
// held: a call that finds one busy lets all of them go (Clear) before it waits.
class DeviceLockSet {
 public:
  explicit DeviceLockSet(const PrepareLocks& locks) : locks_(&locks) {}
  // Takes the locks of the addresses not held yet. False, with `busy` naming the address, when
  // one is held elsewhere; the locks taken so far stay held until Clear.
  Result<bool> TryAdd(const std::set<std::string>& addresses, std::string& busy);
  void Clear() { held_.clear(); }
  size_t size() const { return held_.size(); }

 private:
  const PrepareLocks* locks_;
  std::map<std::string, FileLock> held_;  // by lock file path
};

class PrepareLocks {
 public:
  // Creates <data_dir>/devices if needed.
  static Result<PrepareLocks> Open(const std::string& data_dir);

  // Held for the whole of one call (shared with this version's other calls).
  Result<FileLock> Call(Deadline deadline) const;
  // Held (shared) while a call decides what to do.
  Result<FileLock> Decision(Deadline deadline) const;
  // Held (exclusive) by start-up recovery: no call is deciding meanwhile.
  Result<FileLock> Recovery(Deadline deadline) const;

  // Waits until the device's lock is free (then lets it go again).
  Status AwaitDevice(const std::string& address, Deadline deadline) const;

 private:
  friend class DeviceLockSet;
  explicit PrepareLocks(std::string data_dir) : data_dir_(std::move(data_dir)) {}
  Result<std::string> DevicePath(const std::string& address) const;
  std::string data_dir_;
};

}  // namespace vfio_dra::prepare
