#include "slicepublisher/device_taints.h"

#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <optional>
#include <string_view>

#include "slicepublisher/device_attributes.h"
#include "slicepublisher/slice_validator.h"

namespace vfio_dra::slicepublisher {
namespace {

using discovery::PciFunction;

struct Cause {
  const char* name;
  std::string value;
  const char* effect;
  std::string reason;
};

// The functions whose state decides a device's health: the one handed out (a PCI device, a vGPU
// VF) with the functions bound along with it, or an mdev's parent.
std::vector<std::string> FunctionsOf(const SliceDevice& device, const discovery::NodeScan& scan) {
  const PublishedDeviceView view = DecodePublishedDevice(device);
  std::vector<std::string> functions;
  if (view.pci_bus_id) {
    functions.push_back(*view.pci_bus_id);
    for (const auto& selected : scan.selection.devices) {
      if (selected.address != *view.pci_bus_id) continue;
      functions.insert(functions.end(), selected.companions.begin(), selected.companions.end());
    }
  } else if (view.parent_pci_address) {
    functions.push_back(*view.parent_pci_address);
  }
  return functions;
}

std::vector<Cause> CausesOf(const SliceDevice& device, const discovery::NodeScan& scan) {
  std::vector<Cause> causes;
  std::optional<std::string> fatal;
  std::optional<std::string> unreadable;
  std::optional<std::string> link;
  std::optional<std::string> rebound;
  for (const std::string& address : FunctionsOf(device, scan)) {
    const PciFunction* fn = scan.inventory.Find(address);
    if (fn == nullptr) continue;
    if (!rebound && !fn->foreign_driver.empty()) {
      rebound = fmt::format(
          "PCI function {}, prepared for a claim, was bound to {} outside vfio-dra: the VM using "
          "it has lost it; unprepare the claim (delete the pod) and check who bound it",
          address, fn->foreign_driver);
    }
    if (!fatal && fn->aer_fatal_errors.value_or(0) > 0) {
      fatal = fmt::format(
          "PCI function {} has counted {} fatal PCIe error(s) (aer_dev_fatal): a VM given it "
          "would fail; reset it by removing and rescanning it, or replace it",
          address, *fn->aer_fatal_errors);
    }
    if (!unreadable && !fn->aer_unreadable.empty()) {
      unreadable = "cannot monitor PCI function " + address + ": " + fn->aer_unreadable;
    }
    const PciFunction* pf = fn->sriov_vf ? scan.inventory.Find(fn->sriov_vf->pf) : nullptr;
    if (!link && pf != nullptr && pf->link_down) {
      std::string netdevs;
      for (const std::string& netdev : pf->netdevs) {
        netdevs += (netdevs.empty() ? "" : ", ") + netdev;
      }
      link = fmt::format("the link of PF {} ({}) is down: VF {} passes no traffic until it is up",
                         pf->address, netdevs, address);
    }
  }
  // One key, one cause: a function on a foreign driver says more than an AER count.
  if (rebound) {
    causes.push_back({taint::kUnhealthy, "driver-changed", kEffectNoSchedule, *rebound});
  } else if (fatal) {
    causes.push_back({taint::kUnhealthy, "aer-fatal", kEffectNoSchedule, *fatal});
  }
  if (link) causes.push_back({taint::kDegraded, "pf-link-down", kEffectNone, *link});
  if (unreadable) {
    causes.push_back({taint::kUnmonitored, "aer-unreadable", kEffectNone, *unreadable});
  }
  return causes;
}

// Sets `causes` as the device's taints, keeping the time of each taint that was published the
// same way, and records their reasons.
void Apply(SliceDevice& device, const std::vector<Cause>& causes, const TaintInputs& inputs,
           std::map<std::string, std::string>& reasons) {
  std::vector<const Cause*> taken;
  for (const Cause& cause : causes) {
    if (inputs.effect_none || std::string_view(cause.effect) != kEffectNone) {
      taken.push_back(&cause);
    }
  }
  if (taken.empty()) return;
  std::optional<SliceDevice> before;
  if (inputs.published != nullptr) before = inputs.published->Find(device.name);
  std::string reason;
  for (const Cause* cause : taken) {
    DeviceTaint taint{inputs.driver + "/" + cause->name, cause->value, cause->effect, inputs.now};
    if (before) {
      for (const DeviceTaint& standing : before->taints) {
        if (standing.key == taint.key && standing.value == taint.value &&
            standing.effect == taint.effect) {
          taint.time_added = standing.time_added;
        }
      }
    }
    device.taints.push_back(std::move(taint));
    reason += (reason.empty() ? "" : "; ") + cause->reason;
  }
  std::sort(device.taints.begin(), device.taints.end(),
            [](const DeviceTaint& a, const DeviceTaint& b) { return a.key < b.key; });
  if (device.taints.size() > 4) device.taints.resize(4);
  reasons[device.name] = reason;
}

Cause LostCause(const SliceDevice& device, const std::string& address) {
  const PublishedDeviceView view = DecodePublishedDevice(device);
  const bool vf = view.type == "vf" || view.IsVgpu();
  return {
      taint::kLost, vf ? "vf-removed" : "removed", kEffectNoSchedule,
      fmt::format("PCI function {} is gone ({}); kept published while a prepared claim "
                  "holds it, and dropped once the claim is unprepared",
                  address,
                  vf ? "a VF goes when its PF lowers sriov_numvfs" : "removed or hot-unplugged")};
}

// Held devices that are gone and that nothing published has: the kubelet deletes the node's
// slices when the plugin unregisters, so a device removed before the next instance first
// publishes is known only from the checkpoint. Without counters (its counter set went with it,
// and a NoSchedule device is not allocated); with only the name when the server would refuse the
// recorded attributes (then it stays through here, as KeptDevices keeps only devices that name
// their function). A record that names no function cannot tell whether the device is gone.
void KeepRecordedLost(const discovery::NodeScan& scan, const TaintInputs& inputs,
                      const std::set<std::string>& built, std::vector<SliceDevice>& kept,
                      std::map<std::string, std::string>& reasons) {
  for (const auto& [name, attributes] : inputs.recorded) {
    if (inputs.held.count(name) == 0 || built.count(name) != 0) continue;
    if (inputs.published != nullptr) {
      // One that names its function stands as published (KeptDevices); one kept here with only
      // its name stays through this path.
      const std::optional<SliceDevice> standing = inputs.published->Find(name);
      if (standing && !FunctionsOf(*standing, scan).empty()) continue;
    }
    SliceDevice device{name, attributes, {}};
    const std::vector<std::string> functions = FunctionsOf(device, scan);
    if (functions.empty() || scan.inventory.Listed(functions.front())) continue;
    const Cause lost = LostCause(device, functions.front());
    if (AttributeProblem(device.attributes, inputs.driver)) device.attributes.clear();
    Apply(device, {lost}, inputs, reasons);
    kept.push_back(std::move(device));
  }
}

}  // namespace

void TaintDevice(SliceDevice& device, const discovery::NodeScan& scan, const TaintInputs& inputs,
                 std::map<std::string, std::string>& reasons) {
  Apply(device, CausesOf(device, scan), inputs, reasons);
}

std::vector<SliceDevice> KeptDevices(const discovery::NodeScan& scan, const TaintInputs& inputs,
                                     const std::set<std::string>& built,
                                     std::map<std::string, std::string>& reasons) {
  std::vector<SliceDevice> kept;
  KeepRecordedLost(scan, inputs, built, kept, reasons);
  if (inputs.published == nullptr) return kept;
  inputs.published->ForEach([&](const SliceDevice& published) {
    if (built.count(published.name) != 0) return;
    const std::vector<std::string> functions = FunctionsOf(published, scan);
    if (functions.empty()) return;
    const std::string& address = functions.front();
    std::vector<Cause> causes;
    if (!scan.inventory.Listed(address)) {
      if (inputs.held.count(published.name) == 0) return;
      causes.push_back(LostCause(published, address));
    } else {
      auto decision = scan.selection.functions.find(address);
      if (decision != scan.selection.functions.end() && decision->second.group_unsafe) {
        causes.push_back({taint::kGroupUnsafe, "host-function-in-group", kEffectNoSchedule,
                          "not handed out: " + decision->second.reason});
      } else if (inputs.held.count(published.name) == 0) {
        return;
      }
      // Otherwise a claim holds a device that is there but not built now: a VF the kernel is
      // removing (its physfn link goes before the VF does), or one the policy stopped selecting.
      // It stays as published until the claim is unprepared, so that a removal the next scan
      // sees finished still finds it here and taints it lost instead of it just vanishing.
      for (Cause& cause : CausesOf(published, scan)) causes.push_back(std::move(cause));
    }
    // Apply finds this very device among the published ones and keeps its taints' times.
    SliceDevice device = published;
    device.taints.clear();
    Apply(device, causes, inputs, reasons);
    kept.push_back(std::move(device));
  });
  return kept;
}

std::string TaintCause(const DeviceTaint& taint, const std::string& driver) {
  const std::string prefix = driver + "/";
  return taint.key.compare(0, prefix.size(), prefix) == 0 ? taint.key.substr(prefix.size()) : "";
}

std::string Rfc3339(int64_t unix_seconds) {
  const auto seconds = static_cast<std::time_t>(unix_seconds);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32];
  const size_t written = std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return std::string(text, written);
}

}  // namespace vfio_dra::slicepublisher
