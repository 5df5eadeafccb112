#include "prepare/vf_network_configurator.h"

#include <algorithm>

#include "prepare/kubevirt_networks.h"

namespace vfio_dra::prepare {
namespace {

bool HasNetworkVf(const std::vector<PlannedDevice>& plan) {
  return std::any_of(plan.begin(), plan.end(),
                     [](const PlannedDevice& d) { return d.vf_link.has_value(); });
}

// `base` with every field `over` sets replaced.
vfio::VfNetSettings Overlay(vfio::VfNetSettings base, const vfio::VfNetSettings& over) {
  if (over.mac) base.mac = over.mac;
  if (over.vlan) base.vlan = over.vlan;
  if (over.qos) base.qos = over.qos;
  if (over.vlan_proto) base.vlan_proto = over.vlan_proto;
  if (over.spoof_check) base.spoof_check = over.spoof_check;
  if (over.trust) base.trust = over.trust;
  return base;
}

Error Unavailable(const PlannedDevice& device) {
  return MakeError(ErrorKind::kUnimplemented,
                   "device " + device.result.device + " asks for VF network settings (" +
                       device.config.network.Display() +
                       ") but this plugin runs without VF network configuration");
}

}  // namespace

Status VfNetworkConfigurator::ApplyPodRequests(const kube::ResourceClaim& claim,
                                               std::vector<PlannedDevice>& plan,
                                               Deadline deadline) const {
  if (!HasNetworkVf(plan)) return Status::Ok();
  auto macs = KubevirtNetworkRequests(pods_).MacsFor(claim, deadline);
  if (!macs.ok()) return macs.error();
  for (PlannedDevice& device : plan) {
    auto it = macs->find(device.result.request);
    if (it == macs->end()) it = macs->find(kube::BaseRequestName(device.result.request));
    if (it == macs->end()) continue;
    if (!device.vf_link) {
      return MakeError(ErrorKind::kInvalidArgument,
                       std::string("the pod's ") + kKubevirtDraNetworksAnnotation +
                           " annotation asks MAC " + it->second + " for request " +
                           device.result.request + ", whose device " + device.result.device +
                           " is not an SR-IOV VF of a network adapter");
    }
    if (device.config.network.mac && *device.config.network.mac != it->second) {
      log_.Info("the pod's MAC overrides VfioConfig.macAddress",
                {{"device", device.result.device},
                 {"config", *device.config.network.mac},
                 {"pod", it->second}});
    }
    device.config.network.mac = it->second;
  }
  return Status::Ok();
}

Status VfNetworkConfigurator::Record(const std::vector<PlannedDevice>& plan, ClaimRecord& record,
                                     bool& changed) const {
  for (const PlannedDevice& device : plan) {
    if (!device.vf_link || device.config.network.Empty()) continue;
    if (!network_) return Unavailable(device);
    auto existing =
        std::find_if(record.vf_networks.begin(), record.vf_networks.end(),
                     [&](const VfNetworkRecord& r) { return r.address == device.address; });
    if (existing != record.vf_networks.end()) {
      const vfio::VfNetSettings applied = Overlay(existing->applied, device.config.network);
      if (applied != existing->applied) {
        existing->applied = applied;
        changed = true;
      }
      continue;
    }
    auto previous = network_->Read(*device.vf_link);
    if (!previous.ok()) {
      return previous.error().Wrap("device " + device.result.device + " (PCI " + device.address +
                                   "): cannot read its VF settings");
    }
    record.vf_networks.push_back(
        {device.address, *device.vf_link, *previous, device.config.network});
    changed = true;
  }
  return Status::Ok();
}

Result<std::optional<std::string>> VfNetworkConfigurator::Configure(
    const PlannedDevice& device) const {
  if (!device.vf_link) return std::optional<std::string>();
  const vfio::VfNetSettings& want = device.config.network;
  if (!network_) {
    if (want.Empty()) return std::optional<std::string>();
    return Unavailable(device);
  }
  const std::string who = "device " + device.result.device + " (PCI " + device.address + ", " +
                          device.vf_link->Display() + ")";
  auto current = network_->Read(*device.vf_link);
  if (!current.ok()) {
    if (want.Empty()) {
      // Nothing was asked: the MAC is only reported, so a PF that does not answer costs the
      // report, not the VM.
      log_.Warn("cannot read the VF's MAC for the claim status",
                {{"device", device.result.device}, {"error", current.error().message}});
      return std::optional<std::string>();
    }
    return current.error().Wrap(who + ": cannot read its VF settings");
  }
  const vfio::VfNetSettings unmet = want.Unmet(*current);
  if (!unmet.Empty()) {
    if (Status s = network_->Write(*device.vf_link, unmet); !s.ok()) {
      return s.error().Wrap(who + ": cannot set " + unmet.Display());
    }
  }
  std::optional<std::string> mac = want.mac ? want.mac : current->mac;
  // A VF without an assigned MAC reports zeros; its guest driver makes one up, so there is no
  // address to report.
  if (mac == "00:00:00:00:00:00") mac.reset();
  return mac;
}

Status VfNetworkConfigurator::Restore(const VfNetworkRecord& vf, bool earlier_boot) const {
  vfio::VfNetSettings restore = vf.applied.RestoreFrom(vf.previous);
  if (restore.Empty()) return Status::Ok();
  if (earlier_boot) {
    log_.Info("not restoring VF settings made before the node rebooted",
              {{"function", vf.address}, {"vf", vf.link.Display()}});
    return Status::Ok();
  }
  if (!network_) {
    return MakeError(ErrorKind::kUnimplemented,
                     "PCI " + vf.address + ": cannot restore " + restore.Display() + " on " +
                         vf.link.Display() + ": this plugin runs without VF network configuration");
  }
  // Only what differs now: a prepare that failed or crashed part way set only some fields, and a
  // driver that refuses a setting (trust, say) must not stop the others from being put back.
  if (auto current = network_->Read(vf.link); current.ok()) {
    restore = restore.Unmet(*current);
    if (restore.Empty()) return Status::Ok();
  }
  Status s = network_->Write(vf.link, restore);
  if (!s.ok() && s.error().kind == ErrorKind::kNotFound) {
    log_.Warn("VF settings not restored: the VF or its PF is gone",
              {{"function", vf.address}, {"error", s.error().message}});
    return Status::Ok();
  }
  if (!s.ok()) return s.error().Wrap("PCI " + vf.address + ": cannot restore " + restore.Display());
  return Status::Ok();
}

std::vector<kube::AllocatedDeviceStatus> VfNetworkConfigurator::StatusOf(
    const std::string& driver, const kube::ResourceClaim& claim,
    const std::vector<PlannedDevice>& plan, const std::map<std::string, std::string>& macs) {
  std::vector<kube::AllocatedDeviceStatus> out;
  for (const PlannedDevice& device : plan) {
    const auto mac = macs.find(device.result.device);
    if (!device.vf_link || (mac == macs.end() && device.config.network.Empty())) continue;
    kube::AllocatedDeviceStatus status;
    status.driver = driver;
    status.pool = device.result.pool;
    status.device = device.result.device;
    status.share_id = device.result.share_id;
    kube::DeviceCondition ready;
    ready.type = "Ready";
    ready.status = "True";
    ready.reason = "Prepared";
    ready.message = "bound to " + VfioDriverOf(device, device.address) + " for a VM" +
                    (device.config.network.Empty() ? std::string()
                                                   : " with " + device.config.network.Display());
    ready.observed_generation = claim.generation;
    status.conditions.push_back(std::move(ready));
    if (mac != macs.end()) status.network_data = kube::NetworkDeviceData{"", {}, mac->second};
    out.push_back(std::move(status));
  }
  return out;
}

}  // namespace vfio_dra::prepare
