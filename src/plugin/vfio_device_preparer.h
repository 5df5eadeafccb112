// VfioDevicePreparer: the real device work behind NodePrepareResources/NodeUnprepareResources.
//
// Prepare, per claim: plan (look up and re-check every allocated device), record PrepareStarted
// in the checkpoint with every function's original binding and the mdevs to create, bind each
// function to vfio-pci / create each mdev, verify the /dev/vfio nodes, write the claim's CDI spec
// and the KubeVirt metadata files, then record PrepareCompleted with the answer. Every step is
// idempotent, so a repeated prepare (the kubelet retries; after a reboot bindings and /var/run/cdi
// are gone) re-creates what is missing and gives the same answer. A failed first prepare is rolled
// back completely.
//
// Unprepare undoes exactly what the checkpoint says, in reverse order: CDI specs and metadata,
// the mdevs vfio-dra created, each function back to its original driver and driver_override;
// then the entry is dropped. It needs nothing but the checkpoint, so it works after restarts and
// reboots and when the claim is gone from the API. At startup Recover rolls back claims a crash
// left in PrepareStarted and removes CDI specs that no checkpoint entry owns.
//
// Callers serialize calls (DraNodeService holds the CallSerializer).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/metrics.h"
#include "cdi/cdi_spec.h"
#include "cdi/device_metadata.h"
#include "discovery/sysfs_reader.h"
#include "plugin/device_plan.h"
#include "plugin/device_preparer.h"
#include "plugin/prepare_checkpoint.h"
#include "slicepublisher/published_devices.h"
#include "vfio/mdev_lifecycle.h"
#include "vfio/sysfs_writer.h"
#include "vfio/vfio_nodes.h"
#include "vfio/vfio_pci_binder.h"

namespace vfio_dra::plugin {

inline constexpr const char* kCheckpointFile = "checkpoint.json";

struct PreparerOptions {
  std::string driver_name;
  std::string node_name;
  std::string plugin_data_dir;
  std::string cdi_dir;
  std::string dev_root = "/dev";
  std::chrono::milliseconds unbind_timeout{std::chrono::seconds(20)};
  std::string boot_id_file = "/proc/sys/kernel/random/boot_id";
  // Called with a step name before every change to the node or the disk (tests use it to kill
  // the daemon at each step); may be empty.
  std::function<void(const std::string&)> before_step;
  // Device operation durations and failures go here; may be null.
  MetricsRegistry* metrics = nullptr;
};

struct CheckpointCounts {
  int started = 0;
  int completed = 0;
};

class VfioDevicePreparer final : public DevicePreparer {
 public:
  // Loads the checkpoint; a corrupt one is moved aside and logged, never fatal.
  static Result<std::unique_ptr<VfioDevicePreparer>> Open(
      PreparerOptions options, const discovery::SysfsReader& sysfs, vfio::SysfsWriter& writer,
      const slicepublisher::PublishedDevices& published, Logger log);

  Result<std::vector<PreparedDevice>> Prepare(
      const kube::ResourceClaim& claim,
      const std::vector<kube::DeviceRequestAllocationResult>& ours) override;
  Status Unprepare(const ClaimRef& claim) override;

  // Rolls back claims left in PrepareStarted and removes CDI specs no claim owns. Problems are
  // logged and returned; the daemon starts regardless.
  Status Recover();

  const PrepareCheckpoint& checkpoint() const { return checkpoint_; }
  // Entries by state; safe to call from any thread (metrics).
  CheckpointCounts Counts() const;
  // The devices of completed prepares; safe to call from any thread (the health stream).
  std::shared_ptr<const std::vector<PreparedTarget>> Prepared() const;

 private:
  VfioDevicePreparer(PreparerOptions options, const discovery::SysfsReader& sysfs,
                     vfio::SysfsWriter& writer, const slicepublisher::PublishedDevices& published,
                     PrepareCheckpoint checkpoint, Logger log);

  void Step(const std::string& name) const;
  Status RecordStart(const kube::ResourceClaim& claim, const std::vector<PlannedDevice>& plan,
                     ClaimRecord& record);
  Result<std::vector<PreparedDevice>> Apply(const kube::ResourceClaim& claim,
                                            std::vector<PlannedDevice>& plan);
  Result<cdi::Device> CdiDevice(const std::string& claim_uid, const PlannedDevice& device,
                                bool& needs_container);
  Status WriteMetadata(const kube::ResourceClaim& claim, const std::vector<PlannedDevice>& plan,
                       std::vector<PreparedDevice>& answer);
  // Undoes a record; keeps going past failures and returns the first, after logging warnings.
  Status Undo(const ClaimRecord& record);
  std::string SpecFileName(const std::string& claim_uid) const;
  // Times one device operation (bind, restore, mdev_create, mdev_remove) for the metrics.
  template <typename Op>
  auto Timed(const char* operation, Op op) -> decltype(op());
  void NoteCheckpoint();

  PreparerOptions options_;
  const discovery::SysfsReader& sysfs_;
  const slicepublisher::PublishedDevices& published_;
  PrepareCheckpoint checkpoint_;
  vfio::VfioPciBinder binder_;
  vfio::MdevLifecycle mdevs_;
  vfio::VfioNodes nodes_;
  cdi::SpecDirectory cdi_;
  cdi::MetadataStore metadata_;
  std::string kind_;  // "<driver>/vfio"
  Logger log_;
  mutable std::mutex counts_mu_;
  CheckpointCounts counts_;
  std::shared_ptr<const std::vector<PreparedTarget>> prepared_ =
      std::make_shared<const std::vector<PreparedTarget>>();
};

}  // namespace vfio_dra::plugin
