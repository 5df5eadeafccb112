// VfioPciBinder: moves PCI functions to vfio-pci and back, the way libvirt and driverctl do it:
// per device through driver_override (never the driver-wide new_id, which grabs every matching
// unbound device), unbind with a deadline, an explicit bind, and a check of the `driver` link
// afterwards (the kernel reports success for a probe that bound nothing). Restoring returns a
// function to exactly the driver and driver_override it had before, recorded by Inspect before
// anything was touched. A function that was on vfio-pci already is used as it is and left there.
// Every write goes to the function's own attributes or its drivers' bind/unbind files.
#pragma once

#include <chrono>
#include <string>

#include "base/result.h"
#include "discovery/sysfs_reader.h"
#include "vfio/deadline_writer.h"
#include "vfio/sysfs_writer.h"

namespace vfio_dra::vfio {

inline constexpr const char* kVfioPciDriver = "vfio-pci";

// How a function was bound before vfio-dra touched it.
struct OriginalBinding {
  std::string address;
  std::string driver;    // empty: no driver was bound
  std::string override;  // empty: driver_override was unset
  bool was_on_vfio = false;
  bool operator==(const OriginalBinding&) const = default;
};

struct BinderOptions {
  // How long an unbind may block before the claim fails (the device is probably still in use).
  std::chrono::milliseconds unbind_timeout{std::chrono::seconds(20)};
};

class VfioPciBinder {
 public:
  VfioPciBinder(const discovery::SysfsReader& sysfs, SysfsWriter& writer, BinderOptions options);

  // The function's binding now. kNotFound when the device is gone.
  Result<OriginalBinding> Inspect(const std::string& address) const;
  // Binds the function to vfio-pci; does nothing when it is bound there already.
  Status BindToVfio(const std::string& address);
  // Returns the function to `original`. Problems that retrying cannot fix (the original driver
  // is not loaded, or refuses the device) leave the function unbound and come back as a warning
  // (empty when everything went back); a blocked unbind is an error, to be retried.
  Result<std::string> Restore(const OriginalBinding& original);

 private:
  Result<std::string> CurrentDriver(const std::string& address) const;
  Result<std::string> CurrentOverride(const std::string& address) const;
  Status WriteAttribute(const std::string& relative, const std::string& value,
                        const std::string& what) const;
  Status Unbind(const std::string& address, const std::string& driver);
  // An earlier unbind of the function missed its deadline and is still blocked in the kernel.
  bool UnbindPending(const std::string& address, const std::string& driver) const;

  const discovery::SysfsReader& sysfs_;
  SysfsWriter& writer_;
  DeadlineWriter deadline_writer_;
  BinderOptions options_;
};

}  // namespace vfio_dra::vfio
