#include "vfio/vfio_pci_binder.h"

#include <cerrno>
#include <cstring>

#include "discovery/sysfs_parse.h"

namespace vfio_dra::vfio {
namespace {

std::string DeviceAttribute(const std::string& address, const std::string& name) {
  return "bus/pci/devices/" + address + "/" + name;
}

std::string DriverFile(const std::string& driver, const std::string& name) {
  return "bus/pci/drivers/" + driver + "/" + name;
}

std::string Errno(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

}  // namespace

VfioPciBinder::VfioPciBinder(const discovery::SysfsReader& sysfs, SysfsWriter& writer,
                             BinderOptions options)
    : sysfs_(sysfs), writer_(writer), deadline_writer_(writer), options_(options) {}

Result<std::string> VfioPciBinder::CurrentDriver(const std::string& address) const {
  if (!sysfs_.Exists("bus/pci/devices/" + address)) {
    return MakeError(ErrorKind::kNotFound, "PCI device " + address + " is not present (no " +
                                               sysfs_.Path("bus/pci/devices/" + address) + ")");
  }
  auto driver = sysfs_.LinkBaseName(DeviceAttribute(address, "driver"));
  if (driver.ok()) return *driver;
  if (driver.error().kind == ErrorKind::kNotFound) return std::string();
  return driver.error().Wrap("cannot read the driver of " + address);
}

Result<std::string> VfioPciBinder::CurrentOverride(const std::string& address) const {
  auto text = sysfs_.Read(DeviceAttribute(address, "driver_override"));
  if (!text.ok()) return text.error().Wrap("cannot read driver_override of " + address);
  return discovery::ParseDriverOverride(*text);
}

Result<OriginalBinding> VfioPciBinder::Inspect(const std::string& address) const {
  OriginalBinding binding;
  binding.address = address;
  auto driver = CurrentDriver(address);
  if (!driver.ok()) return driver.error();
  auto override = CurrentOverride(address);
  if (!override.ok()) return override.error();
  binding.driver = *driver;
  binding.override = *override;
  binding.was_on_vfio = binding.driver == kVfioPciDriver;
  return binding;
}

Status VfioPciBinder::WriteAttribute(const std::string& relative, const std::string& value,
                                     const std::string& what) const {
  const int err = writer_.Write(sysfs_.Path(relative), value);
  if (err != 0) {
    return MakeError(ErrorKind::kFailedPrecondition, what + ": writing \"" + value + "\" to " +
                                                         sysfs_.Path(relative) +
                                                         " failed: " + Errno(err));
  }
  return Status::Ok();
}

Status VfioPciBinder::Unbind(const std::string& address, const std::string& driver) {
  const std::string path = sysfs_.Path(DriverFile(driver, "unbind"));
  const int err = deadline_writer_.Write(path, address, options_.unbind_timeout);
  if (err == 0) return Status::Ok();
  if (err == ETIMEDOUT || err == EINPROGRESS) {
    return MakeError(
        ErrorKind::kDeadlineExceeded,
        "unbinding " + address + " from " + driver + " did not finish within " +
            std::to_string(options_.unbind_timeout.count()) +
            " ms; the device is probably still in use (a VM or a host process holds it). The "
            "unbind keeps waiting in the kernel; retry once the user has let go");
  }
  // ENODEV: the driver let go in the meantime, which is what we wanted.
  if (err == ENODEV) {
    auto now = CurrentDriver(address);
    if (now.ok() && now->empty()) return Status::Ok();
  }
  return MakeError(ErrorKind::kFailedPrecondition, "unbinding " + address + " from " + driver +
                                                       " (" + path + ") failed: " + Errno(err));
}

bool VfioPciBinder::UnbindPending(const std::string& address, const std::string& driver) const {
  return deadline_writer_.Blocked(sysfs_.Path(DriverFile(driver, "unbind")), address);
}

Status VfioPciBinder::BindToVfio(const std::string& address) {
  auto driver = CurrentDriver(address);
  if (!driver.ok()) return driver.error();
  if (*driver == kVfioPciDriver) return Status::Ok();
  if (!sysfs_.IsDirectory(std::string("bus/pci/drivers/") + kVfioPciDriver)) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     "cannot bind " + address +
                         " to vfio-pci: the vfio-pci driver is not loaded (" +
                         sysfs_.Path("bus/pci/drivers/vfio-pci") +
                         " is missing); load it on the node with `modprobe vfio-pci`");
  }
  auto override = CurrentOverride(address);
  if (!override.ok()) return override.error();
  if (*override != kVfioPciDriver) {
    if (Status s = WriteAttribute(DeviceAttribute(address, "driver_override"), kVfioPciDriver,
                                  "cannot reserve " + address + " for vfio-pci");
        !s.ok()) {
      return s;
    }
  }
  if (!driver->empty()) {
    if (Status s = Unbind(address, *driver); !s.ok()) return s;
  }
  const int err = writer_.Write(sysfs_.Path(DriverFile(kVfioPciDriver, "bind")), address);
  auto now = CurrentDriver(address);
  if (!now.ok()) return now.error();
  if (*now == kVfioPciDriver) return Status::Ok();
  if (err != 0) {
    std::string hint;
    if (err == EBUSY) hint = " (another driver took it, or it is an SR-IOV PF with VFs enabled)";
    if (err == EINVAL) hint = " (vfio-pci refuses bridges)";
    return MakeError(
        ErrorKind::kFailedPrecondition,
        "binding " + address + " to vfio-pci failed: " + Errno(err) + hint +
            (now->empty() ? "; it is left without a driver" : "; it is now on " + *now));
  }
  return MakeError(
      ErrorKind::kFailedPrecondition,
      "binding " + address + " to vfio-pci reported success, but the device is " +
          (now->empty() ? std::string("not bound to any driver") : "bound to " + *now));
}

Result<std::string> VfioPciBinder::Restore(const OriginalBinding& original) {
  const std::string& address = original.address;
  if (original.was_on_vfio) return std::string();
  auto driver = CurrentDriver(address);
  if (!driver.ok()) {
    if (driver.error().kind == ErrorKind::kNotFound) {
      return "PCI device " + address + " is gone; nothing to restore";
    }
    return driver.error();
  }
  if (!driver->empty() && UnbindPending(address, *driver)) {
    // Restoring now would be undone when the blocked unbind completes: keep the record and let
    // a later unprepare finish the job.
    return MakeError(ErrorKind::kUnavailable,
                     "an earlier unbind of " + address + " from " + *driver +
                         " is still blocked in the kernel; cannot restore it until the device is "
                         "released");
  }
  auto override = CurrentOverride(address);
  if (!override.ok()) return override.error();
  if (*override != original.override) {
    // An empty override is cleared by writing a newline.
    const std::string value = original.override.empty() ? "\n" : original.override;
    if (Status s = WriteAttribute(DeviceAttribute(address, "driver_override"), value,
                                  "cannot restore driver_override of " + address);
        !s.ok()) {
      return s.error();
    }
  }
  if (*driver == original.driver) return std::string();
  if (*driver == kVfioPciDriver) {
    if (Status s = Unbind(address, kVfioPciDriver); !s.ok()) return s.error();
  } else if (!driver->empty()) {
    return "PCI device " + address + " is now bound to " + *driver + ", not to " + kVfioPciDriver +
           "; it is left there (it was on " +
           (original.driver.empty() ? std::string("no driver") : original.driver) + " before)";
  }
  if (original.driver.empty()) return std::string();
  if (!sysfs_.IsDirectory("bus/pci/drivers/" + original.driver)) {
    return "driver " + original.driver + " is not loaded, so " + address +
           " is left without a driver; load the module and bind it (echo " + address +
           " > /sys/bus/pci/drivers/" + original.driver + "/bind)";
  }
  const int err = writer_.Write(sysfs_.Path(DriverFile(original.driver, "bind")), address);
  auto now = CurrentDriver(address);
  if (!now.ok()) return now.error();
  if (*now == original.driver) return std::string();
  return "binding " + address + " back to " + original.driver + " failed" +
         (err != 0 ? ": " + Errno(err) : std::string()) + "; it is left " +
         (now->empty() ? std::string("without a driver") : "on " + *now);
}

}  // namespace vfio_dra::vfio
