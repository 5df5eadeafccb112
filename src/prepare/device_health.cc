#include "prepare/device_health.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "slicepublisher/device_attributes.h"
#include "slicepublisher/device_taints.h"
#include "sysfs/sysfs_parse.h"

namespace vfio_dra::prepare {
namespace {

using slicepublisher::SliceDevice;

std::string FunctionDir(const std::string& address) { return "bus/pci/devices/" + address; }

// A problem with a PCI function that should be present, or nullopt.
std::optional<std::string> FunctionProblem(const sysfs::SysfsReader& sysfs,
                                           const std::string& address,
                                           std::optional<int64_t> expected_group) {
  auto canonical = sysfs::CanonicalBdf(address);
  if (!canonical.ok() || *canonical != address) {
    return "recorded PCI address \"" + address + "\" is malformed";
  }
  if (!sysfs.Exists(FunctionDir(address))) {
    return "PCI function " + address + " is gone (removed or hot-unplugged)";
  }
  if (expected_group) {
    auto group = sysfs.LinkBaseName(FunctionDir(address) + "/iommu_group");
    if (!group.ok()) return "PCI function " + address + " has lost its IOMMU group";
    if (*group != std::to_string(*expected_group)) {
      return "PCI function " + address + " moved from IOMMU group " +
             std::to_string(*expected_group) + " to " + *group;
    }
  }
  return std::nullopt;
}

std::optional<std::string> PreparedProblem(const sysfs::SysfsReader& sysfs,
                                           const PreparedTarget& target) {
  for (const std::string& address : target.functions) {
    if (auto problem = FunctionProblem(sysfs, address, std::nullopt)) return problem;
    auto recorded = target.vfio_drivers.find(address);
    const std::string expected =
        recorded == target.vfio_drivers.end() ? vfio::kVfioPciDriver : recorded->second;
    auto driver = sysfs.LinkBaseName(FunctionDir(address) + "/driver");
    if (!driver.ok()) {
      return "PCI function " + address + " prepared for claim " + target.claim +
             " has no driver; it should be on " + expected;
    }
    if (*driver != expected) {
      return "PCI function " + address + " prepared for claim " + target.claim + " is bound to " +
             *driver + ", not " + expected;
    }
  }
  if (!target.vgpu_vf.empty()) {
    auto current = sysfs.Read(FunctionDir(target.vgpu_vf) + "/nvidia/current_vgpu_type");
    auto type = current.ok() ? sysfs::ParseDecimalAttribute(*current) : Result<int64_t>(0);
    if (!current.ok() || !type.ok() || *type != target.vgpu_type) {
      return "vGPU " + std::to_string(target.vgpu_type) + " on VF " + target.vgpu_vf +
             " prepared for claim " + target.claim + " is gone";
    }
  }
  if (!target.mdev_uuid.empty()) {
    if (!sysfs::IsMdevUuid(target.mdev_uuid)) {
      return "recorded mdev UUID \"" + target.mdev_uuid + "\" is malformed";
    }
    if (!sysfs.Exists("bus/mdev/devices/" + target.mdev_uuid)) {
      return "mediated device " + target.mdev_uuid + " prepared for claim " + target.claim +
             " is gone";
    }
  }
  return std::nullopt;
}

std::optional<std::string> PublishedProblem(const sysfs::SysfsReader& sysfs,
                                            const SliceDevice& device) {
  const slicepublisher::PublishedDeviceView view = slicepublisher::DecodePublishedDevice(device);
  if (const auto& address = view.pci_bus_id) {
    return FunctionProblem(sysfs, *address, view.iommu_group);
  }
  if (const auto& parent = view.parent_pci_address) {
    if (auto problem = FunctionProblem(sysfs, *parent, std::nullopt)) {
      return "parent " + *problem;
    }
  }
  return std::nullopt;
}

}  // namespace

std::vector<DeviceHealthStatus> CheckDeviceHealth(
    const sysfs::SysfsReader& sysfs, const slicepublisher::PublishedDevices::Snapshot& published,
    const std::vector<PreparedTarget>& prepared) {
  std::map<std::pair<std::string, std::string>, std::vector<const PreparedTarget*>> by_device;
  for (const PreparedTarget& target : prepared) {
    by_device[{target.pool, target.device}].push_back(&target);
  }
  auto prepared_problem = [&](const std::string& pool,
                              const std::string& name) -> std::optional<std::string> {
    auto it = by_device.find({pool, name});
    if (it == by_device.end()) return std::nullopt;
    for (const PreparedTarget* target : it->second) {
      if (auto problem = PreparedProblem(sysfs, *target)) return problem;
    }
    return std::nullopt;
  };

  std::vector<DeviceHealthStatus> out;
  std::set<std::pair<std::string, std::string>> reported;
  published.devices->ForEach([&](const SliceDevice& device) {
    DeviceHealthStatus status{published.pool, device.name, true, ""};
    std::optional<std::string> problem = PublishedProblem(sysfs, device);
    if (!problem) problem = prepared_problem(published.pool, device.name);
    if (problem) {
      status.healthy = false;
      status.message = *problem;
    }
    // A tainted device: the stream says what the taint says. NoSchedule taints make it
    // unhealthy; None taints (degraded) leave it healthy, with the reason.
    if (!device.taints.empty()) {
      auto reason = published.taint_reasons->find(device.name);
      const bool blocking = std::any_of(device.taints.begin(), device.taints.end(),
                                        [](const slicepublisher::DeviceTaint& t) {
                                          return t.effect != slicepublisher::kEffectNone;
                                        });
      status.healthy = status.healthy && !blocking;
      // Both: the device's own problem (a prepared vGPU that is gone) says what the VM lost, the
      // taint's reason why the node stopped offering the device. A lost taint's reason is the
      // problem itself, said in full: the two would say "is gone" twice.
      const bool lost = std::any_of(
          device.taints.begin(), device.taints.end(), [](const slicepublisher::DeviceTaint& t) {
            return t.key.ends_with(std::string("/") + slicepublisher::taint::kLost);
          });
      if (reason != published.taint_reasons->end() && reason->second != status.message) {
        status.message = status.message.empty() || lost ? reason->second
                                                        : status.message + "; " + reason->second;
      }
    }
    reported.insert({published.pool, device.name});
    out.push_back(std::move(status));
  });
  for (const auto& [key, targets] : by_device) {
    if (reported.count(key) != 0) continue;
    DeviceHealthStatus status{key.first, key.second, true,
                              "prepared; no longer published by this node"};
    if (auto problem = prepared_problem(key.first, key.second)) {
      status.healthy = false;
      status.message = *problem;
    }
    out.push_back(std::move(status));
  }
  return out;
}

}  // namespace vfio_dra::prepare
