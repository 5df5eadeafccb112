// VfNetworkConfigurator: the SR-IOV network side of preparing a claim. A VF of a network adapter
// gets the settings its claim's VfioConfig asks for (macAddress, vlan, qos, spoofChk, trust), with
// the MAC that KubeVirt's pod annotation asks for taking precedence, set through the PF before the
// VF is bound to VFIO; what the VF had before is recorded in the checkpoint (PrepareStarted)
// before anything is changed, and restored once VFIO has let the VF go and before its host driver
// probes it again (see VfioDevicePreparer::Undo). The result
// (the VF's MAC) goes into the claim's status.devices[].networkData and the KubeVirt metadata.
//
// Invariants: a setting the claim does not ask for is never touched (a VLAN alone keeps the tag's
// priority and protocol); a restore writes back only the fields prepare changed, and only as the
// driver reported them; after a reboot nothing is restored (the PF's driver started the VFs
// afresh, and they may be in other hands).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/deadline.h"
#include "base/log.h"
#include "base/result.h"
#include "kube/claim_status_writer.h"
#include "kube/pod.h"
#include "kube/resource_claim.h"
#include "prepare/device_plan.h"
#include "prepare/prepare_checkpoint.h"
#include "vfio/vf_network.h"

namespace vfio_dra::prepare {

class VfNetworkConfigurator {
 public:
  // `network` null: the node cannot configure VFs (a claim that asks fails saying so); `pods`
  // null: no pod annotations are read.
  VfNetworkConfigurator(std::shared_ptr<vfio::VfNetwork> network, kube::PodReader* pods, Logger log)
      : network_(std::move(network)), pods_(pods), log_(std::move(log)) {}

  // Puts the MACs the claim's pods ask for (kubevirt.io/dra-networks) into the plan's network VFs.
  // Reads the pods only when the plan has a network VF.
  Status ApplyPodRequests(const kube::ResourceClaim& claim, std::vector<PlannedDevice>& plan,
                          Deadline deadline) const;

  // Adds a record of each planned VF's settings before prepare to `record` (once per VF; a retry
  // that asks for more fields adds them); sets `changed` when it added anything.
  Status Record(const std::vector<PlannedDevice>& plan, ClaimRecord& record, bool& changed) const;

  // Sets what `device` asks for on its VF (unless it is set already). Returns the VF's MAC now,
  // when it is known (nullopt for devices that are no network VF, or whose PF does not say).
  Result<std::optional<std::string>> Configure(const PlannedDevice& device) const;

  // Writes back what `vf` recorded; a VF or PF that is gone has nothing to restore.
  Status Restore(const VfNetworkRecord& vf, bool earlier_boot) const;

  // The claim status entries of the network VFs among `plan` that have something to report: a
  // MAC (by device name in `macs`) or settings that were applied. A VF with neither gets no entry,
  // so a plain VF claim costs no API write.
  static std::vector<kube::AllocatedDeviceStatus> StatusOf(
      const std::string& driver, const kube::ResourceClaim& claim,
      const std::vector<PlannedDevice>& plan, const std::map<std::string, std::string>& macs);

 private:
  std::shared_ptr<vfio::VfNetwork> network_;
  kube::PodReader* pods_;
  Logger log_;
};

}  // namespace vfio_dra::prepare
