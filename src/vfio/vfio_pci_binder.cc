#include "vfio/vfio_pci_binder.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "base/file_io.h"
#include "sysfs/sysfs_parse.h"
#include "vfio/device_holders.h"

namespace vfio_dra::vfio {
namespace {

std::string DeviceAttribute(const std::string& address, const std::string& name) {
  return "bus/pci/devices/" + address + "/" + name;
}

std::string DriverFile(const std::string& driver, const std::string& name) {
  return "bus/pci/drivers/" + driver + "/" + name;
}

}  // namespace

VfioPciBinder::VfioPciBinder(const sysfs::SysfsReader& sysfs, DeviceLockGate& gate,
                             BinderOptions options)
    : sysfs_(sysfs), gate_(gate), options_(std::move(options)) {}

std::chrono::milliseconds VfioPciBinder::Wait(Deadline deadline) const {
  return deadline.RemainingOr(options_.unbind_timeout);
}

std::string VfioPciBinder::Holders(const std::string& address) const {
  // The function's group node and its vfio-dev cdevs are what a VMM holds open.
  std::vector<dev_t> devices;
  auto add = [&](const std::string& node) {
    struct stat st {};
    if (::stat(node.c_str(), &st) == 0 && S_ISCHR(st.st_mode)) devices.push_back(st.st_rdev);
  };
  if (auto group = sysfs_.LinkBaseName(DeviceAttribute(address, "iommu_group")); group.ok()) {
    add(options_.dev_root + "/vfio/" + *group);
    add(options_.dev_root + "/vfio/noiommu-" + *group);
  }
  if (auto cdevs = sysfs_.List(DeviceAttribute(address, "vfio-dev")); cdevs.ok()) {
    for (const std::string& cdev : *cdevs) add(options_.dev_root + "/vfio/devices/" + cdev);
  }
  const std::string found = DescribeHolders(FindDeviceHolders(options_.proc_root, devices));
  return options_.holders_gap.empty() ? found : found + " (" + options_.holders_gap + ")";
}

Error VfioPciBinder::InUse(const std::string& address, const Error& error) const {
  return MakeError(error.kind,
                   error.message +
                       "; the device is probably still in use (a VM or a host "
                       "process holds it): " +
                       Holders(address) +
                       ". The kernel finishes the unbind once it is let go; retry then");
}

std::optional<std::string> VfioPciBinder::Busy(const std::string& address) const {
  auto held = gate_.Held(address);
  if (!held) return std::nullopt;
  return "PCI device " + address + " is still in use: an earlier " + *held + " has not returned; " +
         Holders(address);
}

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

Result<std::string> VfioPciBinder::CurrentOverride(const std::string& address,
                                                   Deadline deadline) const {
  auto text =
      gate_.Read(address, sysfs_.Path(DeviceAttribute(address, "driver_override")), Wait(deadline));
  if (!text.ok()) {
    if (text.error().kind == ErrorKind::kDeadlineExceeded ||
        text.error().kind == ErrorKind::kUnavailable) {
      return InUse(address, text.error());
    }
    return text.error().Wrap("cannot read driver_override of " + address);
  }
  return sysfs::ParseDriverOverride(*text);
}

Result<OriginalBinding> VfioPciBinder::Inspect(const std::string& address,
                                               const std::string& vfio_driver,
                                               Deadline deadline) const {
  OriginalBinding binding;
  binding.address = address;
  auto driver = CurrentDriver(address);
  if (!driver.ok()) return driver.error();
  auto override = CurrentOverride(address, deadline);
  if (!override.ok()) return override.error();
  binding.driver = *driver;
  binding.override = *override;
  binding.vfio_driver = vfio_driver;
  binding.was_on_vfio = binding.driver == vfio_driver;
  return binding;
}

Status VfioPciBinder::UnbindFailed(const std::string& address, const std::string& driver,
                                   int err) const {
  // ENODEV: the driver let go in the meantime, which is what we wanted.
  if (err == ENODEV) {
    auto now = CurrentDriver(address);
    if (now.ok() && now->empty()) return Status::Ok();
  }
  return MakeError(ErrorKind::kFailedPrecondition,
                   "unbinding " + address + " from " + driver + " (" +
                       sysfs_.Path(DriverFile(driver, "unbind")) + ") failed: " + ErrnoText(err));
}

Result<VfioPciBinder::RebindOutcome> VfioPciBinder::Rebind(const RebindPlan& plan,
                                                           Deadline deadline) const {
  // The operation may outlive this call (the kernel blocks it): it owns its plan and outcome.
  auto outcome = std::make_shared<RebindOutcome>();
  Status ran = gate_.Run(
      plan.address, "moving " + plan.address + " to " + plan.target,
      [plan, outcome](DeviceAccess& access) {
        outcome->override_read = access.Read(plan.override_path);
        if (!outcome->override_read->ok()) return;
        if (sysfs::ParseDriverOverride(**outcome->override_read) != plan.override) {
          access.Step(plan.override_purpose);
          // An empty override is cleared by writing a newline.
          outcome->override_write =
              access.Write(plan.override_path, plan.override.empty() ? "\n" : plan.override);
          if (*outcome->override_write != 0) return;
        }
        if (!plan.unbind_from.empty()) {
          access.Step("unbinding " + plan.address + " from " + plan.unbind_from);
          outcome->unbind = access.Write(plan.unbind_path, plan.address);
          if (*outcome->unbind != 0) return;
        }
        if (!plan.bind_path.empty()) {
          access.Step("binding " + plan.address + " to " + plan.target);
          outcome->bind = access.Write(plan.bind_path, plan.address);
        }
      },
      Wait(deadline));
  if (!ran.ok()) return InUse(plan.address, ran.error());
  const RebindOutcome& done = *outcome;
  if (!done.override_read->ok()) {
    return done.override_read->error().Wrap("cannot read driver_override of " + plan.address);
  }
  if (done.override_write && *done.override_write != 0) {
    const std::string value = plan.override.empty() ? "\n" : plan.override;
    return MakeError(ErrorKind::kFailedPrecondition,
                     plan.override_purpose + ": writing \"" + value + "\" to " +
                         plan.override_path + " failed: " + ErrnoText(*done.override_write));
  }
  if (done.unbind && *done.unbind != 0) {
    if (Status s = UnbindFailed(plan.address, plan.unbind_from, *done.unbind); !s.ok()) {
      return s.error();
    }
    // The driver had let go already: the bind still has to happen.
    RebindOutcome rest = done;
    if (!plan.bind_path.empty()) {
      auto bound = gate_.Write(plan.address, plan.bind_path, plan.address, Wait(deadline));
      if (!bound.ok()) {
        return InUse(plan.address,
                     bound.error().Wrap("binding " + plan.address + " to " + plan.target));
      }
      rest.bind = *bound;
    }
    return rest;
  }
  return done;
}

Status VfioPciBinder::BindToVfio(const std::string& address, const std::string& vfio_driver,
                                 Deadline deadline) {
  // An earlier operation still blocked in the kernel holds the device lock: refuse now, before
  // anything reads the driver link (the kernel removed it when the unbind began).
  if (auto busy = Busy(address)) return MakeError(ErrorKind::kUnavailable, *busy);
  auto driver = CurrentDriver(address);
  if (!driver.ok()) return driver.error();
  if (*driver == vfio_driver) return Status::Ok();
  if (!sysfs_.IsDirectory("bus/pci/drivers/" + vfio_driver)) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     "cannot bind " + address + " to " + vfio_driver +
                         ": the driver is not loaded (" +
                         sysfs_.Path("bus/pci/drivers/" + vfio_driver) +
                         " is missing); load it on the node with `modprobe " + vfio_driver + "`");
  }
  // VFIO drivers match only through driver_override (vfio-pci has no ID table; variant drivers
  // mark theirs override-only), so the override is what makes the bind below take.
  RebindPlan plan;
  plan.address = address;
  plan.target = vfio_driver;
  plan.override_path = sysfs_.Path(DeviceAttribute(address, "driver_override"));
  plan.override = vfio_driver;
  plan.override_purpose = "cannot reserve " + address + " for " + vfio_driver;
  if (!driver->empty()) {
    plan.unbind_from = *driver;
    plan.unbind_path = sysfs_.Path(DriverFile(*driver, "unbind"));
  }
  plan.bind_path = sysfs_.Path(DriverFile(vfio_driver, "bind"));
  auto outcome = Rebind(plan, deadline);
  if (!outcome.ok()) return outcome.error();
  const int err = outcome->bind.value_or(0);
  auto now = CurrentDriver(address);
  if (!now.ok()) return now.error();
  if (*now == vfio_driver) return Status::Ok();
  if (err != 0) {
    std::string hint;
    if (err == EBUSY) hint = " (another driver took it, or it is an SR-IOV PF with VFs enabled)";
    if (err == EINVAL) hint = " (VFIO drivers refuse bridges)";
    if (err == ENODEV && vfio_driver != kVfioPciDriver) {
      hint = " (" + vfio_driver + " does not serve this device; pin vfio-pci for it in the policy)";
    }
    return MakeError(
        ErrorKind::kFailedPrecondition,
        "binding " + address + " to " + vfio_driver + " failed: " + ErrnoText(err) + hint +
            (now->empty() ? "; it is left without a driver" : "; it is now on " + *now));
  }
  return MakeError(
      ErrorKind::kFailedPrecondition,
      "binding " + address + " to " + vfio_driver + " reported success, but the device is " +
          (now->empty() ? std::string("not bound to any driver") : "bound to " + *now));
}

Result<std::string> VfioPciBinder::Restore(const OriginalBinding& original, Deadline deadline,
                                           const std::function<void()>& released) {
  const std::string& address = original.address;
  const auto run_released = [&released] {
    if (released) released();
  };
  if (original.was_on_vfio) {
    // It stays where it was before the claim: there is nothing to release it from.
    run_released();
    return std::string();
  }
  // Restoring while an earlier unbind is blocked would be undone when it completes, and every
  // access would block behind it: keep the record and let a later unprepare finish the job.
  if (auto busy = Busy(address)) {
    return MakeError(ErrorKind::kUnavailable,
                     *busy + "; it is restored once the device is released (unprepare retries)");
  }
  auto driver = CurrentDriver(address);
  if (!driver.ok()) {
    if (driver.error().kind == ErrorKind::kNotFound) {
      run_released();
      return "PCI device " + address + " is gone; nothing to restore";
    }
    return driver.error();
  }
  // driver_override goes back first, whatever the driver: then nothing binds the function to a
  // VFIO driver again behind our back.
  RebindPlan release;
  release.address = address;
  release.target = "no driver";
  release.override_path = sysfs_.Path(DeviceAttribute(address, "driver_override"));
  release.override = original.override;
  release.override_purpose = "cannot restore driver_override of " + address;
  std::string left;  // why the function is not on its original driver afterwards
  const bool moved = *driver != original.driver;
  if (moved && *driver == original.vfio_driver) {
    release.unbind_from = original.vfio_driver;
    release.unbind_path = sysfs_.Path(DriverFile(original.vfio_driver, "unbind"));
  } else if (moved && !driver->empty()) {
    left = "PCI device " + address + " is now bound to " + *driver + ", not to " +
           original.vfio_driver + "; it is left there (it was on " +
           (original.driver.empty() ? std::string("no driver") : original.driver) + " before)";
  }
  const bool bind_back = moved && left.empty() && !original.driver.empty();
  if (bind_back && !sysfs_.IsDirectory("bus/pci/drivers/" + original.driver)) {
    left = "driver " + original.driver + " is not loaded, so " + address +
           " is left without a driver; load the module and bind it (echo " + address +
           " > /sys/bus/pci/drivers/" + original.driver + "/bind)";
  }
  if (auto outcome = Rebind(release, deadline); !outcome.ok()) return outcome.error();
  run_released();
  if (!left.empty() || !bind_back) return left;
  return BindBack(original, deadline);
}

Result<std::string> VfioPciBinder::BindBack(const OriginalBinding& original, Deadline deadline) {
  const std::string& address = original.address;
  if (deadline.Expired()) {
    return MakeError(ErrorKind::kDeadlineExceeded,
                     "PCI device " + address + " is off " + original.vfio_driver +
                         " but not yet bound back to " + original.driver +
                         ": the deadline of this call is reached; its retry binds it");
  }
  RebindPlan plan;
  plan.address = address;
  plan.target = original.driver;
  plan.override_path = sysfs_.Path(DeviceAttribute(address, "driver_override"));
  plan.override = original.override;
  plan.override_purpose = "cannot restore driver_override of " + address;
  plan.bind_path = sysfs_.Path(DriverFile(original.driver, "bind"));
  auto outcome = Rebind(plan, deadline);
  if (!outcome.ok()) return outcome.error();
  const int err = outcome->bind.value_or(0);
  auto now = CurrentDriver(address);
  if (!now.ok()) return now.error();
  if (*now == original.driver) return std::string();
  return "binding " + address + " back to " + original.driver + " failed" +
         (err != 0 ? ": " + ErrnoText(err) : std::string()) + "; it is left " +
         (now->empty() ? std::string("without a driver") : "on " + *now);
}

}  // namespace vfio_dra::vfio
