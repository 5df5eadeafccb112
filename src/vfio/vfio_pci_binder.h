// VfioPciBinder: moves PCI functions to vfio-pci (or the vendor variant of it chosen for them,
// discovery/vfio_driver_choice.h) and back, the way libvirt and driverctl do it:
// per device through driver_override (never the driver-wide new_id, which grabs every matching
// unbound device), unbind with a deadline, an explicit bind, and a check of the `driver` link
// afterwards (the kernel reports success for a probe that bound nothing). Restoring returns a
// function to exactly the driver and driver_override it had before, recorded by Inspect before
// anything was touched, in two steps: off the VFIO driver first, then to the original driver, with
// the caller's work for a function that no driver holds in between. A function that was on
// vfio-pci already is used as it is and left there.
// Every write goes to the function's own attributes or its drivers' bind/unbind files, and every
// read or write that can take the kernel's device lock goes through the DeviceLockGate, bounded
// by the caller's deadline: a function whose earlier unbind is still blocked (a VM holds it) is
// refused at once, with the processes that hold it, instead of blocking the caller.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "base/deadline.h"
#include "base/result.h"
#include "sysfs/sysfs_reader.h"
#include "vfio/device_lock_gate.h"

namespace vfio_dra::vfio {

inline constexpr const char* kVfioPciDriver = "vfio-pci";

// How a function was bound before vfio-dra touched it.
struct OriginalBinding {
  std::string address;
  std::string driver;                        // empty: no driver was bound
  std::string override;                      // empty: driver_override was unset
  bool was_on_vfio = false;                  // it was on `vfio_driver` already, and stays there
  std::string vfio_driver = kVfioPciDriver;  // the VFIO driver prepare binds it to
  bool operator==(const OriginalBinding&) const = default;
};

struct BinderOptions {
  // How long an unbind (or any lock-taking access) may block before the claim fails (the device
  // is probably still in use); the caller's deadline shortens it.
  std::chrono::milliseconds unbind_timeout{std::chrono::seconds(20)};
  std::string dev_root = "/dev";    // where the /dev/vfio nodes are, to find who holds them
  std::string proc_root = "/proc";  // the processes to look through
  // Why holders may be missing from the description (HolderNamingGap); empty: they are not.
  std::string holders_gap{};
};

class VfioPciBinder {
 public:
  VfioPciBinder(const sysfs::SysfsReader& sysfs, DeviceLockGate& gate, BinderOptions options);

  // The function's binding now, to be bound to `vfio_driver`. kNotFound when the device is gone.
  Result<OriginalBinding> Inspect(const std::string& address,
                                  const std::string& vfio_driver = kVfioPciDriver,
                                  Deadline deadline = {}) const;
  // Binds the function to `vfio_driver` (vfio-pci or a variant of it); does nothing when it is
  // bound there already.
  Status BindToVfio(const std::string& address, const std::string& vfio_driver = kVfioPciDriver,
                    Deadline deadline = {});
  // Returns the function to `original`. Problems that retrying cannot fix (the original driver
  // is not loaded, or refuses the device) leave the function unbound and come back as a warning
  // (empty when everything went back); a blocked unbind is an error, to be retried.
  // `released` runs once the VFIO driver has let the function go and before the original driver
  // is bound: what the host driver reads when it probes (a VF's MAC, set through its PF) is put
  // back there. It does not run when the function is not released (its unbind is blocked: a VM
  // still holds it). A deadline reached after it ran leaves the function on no driver, with an
  // error; the retry binds it.
  Result<std::string> Restore(const OriginalBinding& original, Deadline deadline = {},
                              const std::function<void()>& released = {});
  // Why the function cannot be touched now (an earlier operation on it is still blocked in the
  // kernel), naming the processes that hold it; nothing when it can.
  std::optional<std::string> Busy(const std::string& address) const;

 private:
  Result<std::string> CurrentDriver(const std::string& address) const;
  // The second step of Restore: the released function to its original driver.
  Result<std::string> BindBack(const OriginalBinding& original, Deadline deadline);
  Result<std::string> CurrentOverride(const std::string& address, Deadline deadline) const;
  // The lock-taking part of moving a function between drivers, run as one operation of the gate
  // (one hand-over to its thread): driver_override set to `override` (when it holds something
  // else), an unbind from `unbind_from` (when set), a bind through `bind_path` (when set). Each
  // access runs only if the ones before it succeeded.
  struct RebindPlan {
    std::string address;
    std::string target;  // the driver it goes to, for messages
    std::string override_path;
    std::string override;  // what driver_override must hold; empty: unset
    std::string override_purpose;
    std::string unbind_from;
    std::string unbind_path;
    std::string bind_path;
  };
  // What each access that ran returned (errno for writes).
  struct RebindOutcome {
    std::optional<Result<std::string>> override_read;
    std::optional<int> override_write;
    std::optional<int> unbind;
    std::optional<int> bind;
  };
  // Errors when an access failed (except a bind's, which the caller judges by the driver link).
  Result<RebindOutcome> Rebind(const RebindPlan& plan, Deadline deadline) const;
  Status UnbindFailed(const std::string& address, const std::string& driver, int err) const;
  std::chrono::milliseconds Wait(Deadline deadline) const;
  // Turns a gate refusal or timeout into the error the kubelet shows, with who holds the device.
  Error InUse(const std::string& address, const Error& error) const;
  std::string Holders(const std::string& address) const;

  const sysfs::SysfsReader& sysfs_;
  DeviceLockGate& gate_;
  BinderOptions options_;
};

}  // namespace vfio_dra::vfio
