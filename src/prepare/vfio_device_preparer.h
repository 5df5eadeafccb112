// VfioDevicePreparer: the real device work behind NodePrepareResources/NodeUnprepareResources.
//
// Prepare, per claim: lock the claim's devices (PrepareLocks), read the checkpoint from disk
// (holding those locks, this is the truth even with a second instance running), plan (look up and
// re-check every allocated device, or rebuild the plan of a claim prepared before from its record),
// refuse devices another claim holds, record PrepareStarted with every function's original binding
// and identity and the mdevs to create, bind each function to vfio-pci / create each mdev, verify
// the /dev/vfio nodes (a vGPU VF is not rebound: its vGPU type is set instead), write the claim's
// CDI spec and the KubeVirt metadata files, then record PrepareCompleted with the answer. Every
// step is idempotent, so a repeated prepare (the kubelet retries; a shared claim; after a reboot
// bindings and /var/run/cdi are gone) re-creates what is missing and gives the same answer without
// touching what is in place. A failed first prepare is rolled back, unless the kubelet's deadline
// ran out: then the record stays for the retry (or the unprepare) to finish.
//
// Unprepare undoes exactly what the checkpoint says, in reverse order: CDI specs and metadata,
// the mdevs vfio-dra created, each function back to its original driver and driver_override;
// then the record is dropped. It needs nothing but the checkpoint, so it works after restarts and
// reboots and when the claim is gone from the API. Records from an earlier boot are checked
// against what the addresses name now. At startup Recover upgrades an old checkpoint, rolls back
// claims a crash left in PrepareStarted and removes CDI specs that no record owns.
//
// The preparer locks for itself (PrepareLocks): calls for claims on different devices run in
// parallel, from any number of threads and from both instances of a rolling update.
//
// Each phase has a file of its own: prepare_decision.cc (Prepare: deciding and recording the
// start), prepare_checks.cc, prepare_apply.cc, prepare_undo.cc (Unprepare and Undo),
// prepare_recovery.cc (Recover) and preparer_snapshots.cc.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/file_io.h"
#include "base/log.h"
#include "base/metrics.h"
#include "cdi/cdi_spec.h"
#include "cdi/device_metadata.h"
#include "kube/claim_status_queue.h"
#include "prepare/device_plan.h"
#include "prepare/device_preparer.h"
#include "prepare/prepare_checkpoint.h"
#include "prepare/prepare_locks.h"
#include "prepare/vf_network_configurator.h"
#include "slicepublisher/published_devices.h"
#include "sysfs/sysfs_reader.h"
#include "sysfs/sysfs_writer.h"
#include "vfio/device_lock_gate.h"
#include "vfio/mdev_lifecycle.h"
#include "vfio/privilege_check.h"
#include "vfio/vfio_nodes.h"
#include "vfio/vfio_pci_binder.h"
#include "vfio/vgpu_vf_lifecycle.h"

namespace vfio_dra::prepare {

struct PreparerOptions {
  std::string driver_name;
  std::string node_name;
  std::string plugin_data_dir;
  std::string cdi_dir;
  std::string dev_root = "/dev";
  std::chrono::milliseconds unbind_timeout{std::chrono::seconds(20)};
  std::string boot_id_file = "/proc/sys/kernel/random/boot_id";
  // The prepare checkpoint's fsyncs (tests count them); unset members run fsync(2).
  DiskSync checkpoint_sync;
  // Called with a step name before every change to the node or the disk (tests use it to kill
  // the daemon at each step); may be empty.
  std::function<void(const std::string&)> before_step;
  // Device operation durations and failures go here; may be null.
  MetricsRegistry* metrics = nullptr;
  // Picks each function's VFIO driver (variant drivers); null: vfio-pci for every function.
  std::shared_ptr<const discovery::VfioDriverChooser> vfio_drivers;
  // Sets SR-IOV VFs' MAC, VLAN, spoof checking and trust through their PF; null: claims that ask
  // for such settings fail saying the node cannot.
  std::shared_ptr<vfio::VfNetwork> vf_network;
  // Reads the pods that use a claim of network VFs (KubeVirt's MAC annotation); may be null.
  kube::PodReader* pods = nullptr;
  // Writes the network VFs' status into their claims in the background (a prepare does not wait
  // for it, nor fail with it); may be null (nothing is written).
  kube::ClaimStatusQueue* claim_status = nullptr;
  // What the process lacks for each feature (vfio/privilege_check.h), as last checked: a device
  // whose feature lacks a privilege is refused before anything is touched. May be empty, and may
  // return null (not checked yet).
  std::function<std::shared_ptr<const std::vector<vfio::MissingPrivilege>>()> missing_privileges;
  // Why a busy device's holders may go unnamed (vfio::HolderNamingGap); empty: they are named.
  std::string holders_gap;
  // Runs after an unprepare has undone a claim: the devices it held are free (a device that is
  // gone is published only while a claim holds it). May be empty.
  std::function<void()> after_unprepare;
};

struct CheckpointCounts {
  int started = 0;
  int completed = 0;
};

class VfioDevicePreparer final : public DevicePreparer {
 public:
  // Sets up the checkpoint directory; nothing is read until a call (under the lock) needs it.
  static Result<std::unique_ptr<VfioDevicePreparer>> Open(
      PreparerOptions options, const sysfs::SysfsReader& sysfs, sysfs::SysfsWriter& writer,
      const slicepublisher::PublishedDevices& published, Logger log);

  Result<std::vector<PreparedDevice>> Prepare(
      const kube::ResourceClaim& claim,
      const std::vector<kube::DeviceRequestAllocationResult>& ours, Deadline deadline) override;
  Status Unprepare(const ClaimRef& claim, Deadline deadline) override;

  // Upgrades a version-1 checkpoint, rolls back claims left in PrepareStarted and removes CDI
  // specs no claim owns. Problems are logged and returned; the daemon starts regardless.
  Status Recover();

  // Re-reads the checkpoint for the snapshots below (records are replaced atomically, so this
  // needs no lock; the other instance's changes show up here).
  void Refresh();

  const PrepareCheckpoint& checkpoint() const { return checkpoint_; }
  // Entries by state; safe to call from any thread (metrics).
  CheckpointCounts Counts() const;
  // The devices of completed prepares; safe to call from any thread (the health stream).
  std::shared_ptr<const std::vector<PreparedTarget>> Prepared() const;
  // Every function a claim holds, with its original and VFIO driver; safe from any thread
  // (discovery).
  std::shared_ptr<const std::map<std::string, discovery::ManagedFunction>> ManagedFunctions() const;

 private:
  VfioDevicePreparer(PreparerOptions options, const sysfs::SysfsReader& sysfs,
                     sysfs::SysfsWriter& writer, const slicepublisher::PublishedDevices& published,
                     PrepareCheckpoint checkpoint, PrepareLocks locks, Logger log);

  // What a prepare decided, with the device locks it holds while it changes the node.
  struct PrepareDecision {
    std::vector<PlannedDevice> plan;
    ClaimRecord record;  // as written with PrepareStarted (or as completed before)
    std::optional<ClaimRecord> existing;
    bool was_completed = false;
    bool changed = false;
    DeviceLockSet devices;
  };
  Result<PrepareDecision> DecidePrepare(
      const kube::ResourceClaim& claim,
      const std::vector<kube::DeviceRequestAllocationResult>& ours, const std::string& who,
      Deadline deadline);
  // The last phase of a decision, with every device locked and no clash found: checks a record
  // of an earlier boot against the devices now at its addresses, then records the start (visible
  // to other calls) when anything is new.
  Status RecordDecision(const kube::ResourceClaim& claim, PrepareDecision& d,
                        const std::string& who, Deadline deadline);
  // The published functions (PCI devices) and parents (mdevs) of the allocated devices.
  std::set<std::string> PublishedKeys(
      const std::vector<kube::DeviceRequestAllocationResult>& ours) const;

  void Step(const std::string& name) const;
  // Reads every record, logs the problems and refreshes the snapshots.
  CheckpointView LoadView();
  // The snapshots (counts, prepared targets, managed functions) from every record, read by a
  // Load that began when NoteGeneration() was `loaded_after`; or with one claim's record replaced
  // (null: dropped) after a call changed only that one.
  void Note(const CheckpointView& view, uint64_t loaded_after);
  uint64_t NoteGeneration() const;
  void NoteClaim(const std::string& uid, std::shared_ptr<const ClaimRecord> record);
  // NoteClaim with the claim's record as it is on disk now.
  void NoteClaimOnDisk(const std::string& uid);
  // The snapshots (counts, prepared targets, managed functions) are rebuilt from noted_ when
  // next asked for, not at every note: a burst of prepares notes a claim each, and rebuilding
  // from every claim at each would cost the burst the square of its size. Called with
  // snapshot_mu_ held.
  void BuildSnapshotsLocked() const;
  // Adds what `plan` needs to `record`; sets `changed` when something was added.
  Status RecordStart(const kube::ResourceClaim& claim, const std::vector<PlannedDevice>& plan,
                     ClaimRecord& record, bool& changed, Deadline deadline);
  Result<PciIdentity> ReadIdentity(const std::string& address) const;
  // A device another claim holds (a function, an mdev, or the parent of either) is refused.
  Status CheckOverlap(const CheckpointView& view, const std::string& uid,
                      const std::vector<PlannedDevice>& plan) const;
  // Each vGPU VF the claim's record does not hold yet is as the plan needs it: free for a type
  // vfio-dra makes, holding the type of a vGPU handed out as it is. Nothing is touched.
  Status CheckNewVgpus(const std::vector<PlannedDevice>& plan,
                       const std::optional<ClaimRecord>& existing) const;
  // Each planned device's features have the privileges they need (nothing is touched yet).
  Status CheckPrivilegesOf(const std::vector<PlannedDevice>& plan) const;
  // After a reboot: every recorded function must still be the device it was.
  Status CheckIdentities(const ClaimRecord& record) const;
  // `macs` receives the MAC of each network VF (by device name), for the metadata and status.
  // `record` is the claim's, written: it says whose each vGPU is.
  Result<std::vector<PreparedDevice>> Apply(const kube::ResourceClaim& claim,
                                            std::vector<PlannedDevice>& plan,
                                            const ClaimRecord& record,
                                            std::map<std::string, std::string>& macs,
                                            Deadline deadline);
  // Binds (or creates) one planned device, after setting its VF's network settings.
  Status ApplyDevice(const PlannedDevice& device, const ClaimRecord& record,
                     std::map<std::string, std::string>& macs, Deadline deadline);
  // Hands the network VFs' Ready condition and MAC to the claim status queue.
  void WriteClaimStatus(const kube::ResourceClaim& claim, const std::vector<PlannedDevice>& plan,
                        const std::map<std::string, std::string>& macs);
  // After an unprepare: removes the entries prepare may have written (and any write of them still
  // pending), in the background.
  void ClearClaimStatus(const ClaimRecord& record);
  Result<cdi::Device> CdiDevice(const std::string& claim_uid, const PlannedDevice& device,
                                bool& needs_container);
  Status WriteMetadata(const kube::ResourceClaim& claim, const std::vector<PlannedDevice>& plan,
                       const std::map<std::string, std::string>& macs,
                       std::vector<PreparedDevice>& answer);
  // Start-up recovery of one record seen in PrepareStarted: takes its devices' locks, then undoes
  // it only if the record on disk is still the one seen.
  Status RollBackInterrupted(const ClaimRecord& seen);
  // Undoes a record; keeps going past failures and returns the first, after logging warnings.
  Status Undo(const ClaimRecord& record, Deadline deadline);
  // Undo's part for the record's functions and their VFs' network settings, in reverse order;
  // `note` takes each failure, `out_of_time` says (and notes) when the deadline stops the rest.
  void RestoreFunctions(const ClaimRecord& record, bool earlier_boot, Deadline deadline,
                        const std::function<void(const Error&)>& note,
                        const std::function<bool(const std::string&)>& out_of_time);
  std::string SpecFileName(const std::string& claim_uid) const;
  // Times one device operation (bind, restore, mdev_create, mdev_remove, vgpu_create,
  // vgpu_remove) for the metrics.
  template <typename Op>
  auto Timed(const char* operation, Op op) -> decltype(op());

  PreparerOptions options_;
  const sysfs::SysfsReader& sysfs_;
  const slicepublisher::PublishedDevices& published_;
  PrepareCheckpoint checkpoint_;
  PrepareLocks locks_;
  vfio::DeviceLockGate gate_;
  vfio::VfioPciBinder binder_;
  vfio::MdevLifecycle mdevs_;
  vfio::VgpuVfLifecycle vgpus_;
  vfio::VfioNodes nodes_;
  VfNetworkConfigurator vf_network_;
  cdi::SpecDirectory cdi_;
  cdi::MetadataStore metadata_;
  std::string kind_;  // "<driver>/vfio"
  Logger log_;
  mutable std::mutex snapshot_mu_;
  CheckpointView noted_;                      // the records the snapshots below are made from
  uint64_t note_generation_ = 0;              // NoteClaim calls so far
  std::map<std::string, uint64_t> noted_at_;  // claim uid -> generation of its last NoteClaim
  mutable bool snapshots_stale_ = false;      // noted_ changed since the snapshots were built
  mutable CheckpointCounts counts_;
  mutable std::shared_ptr<const std::vector<PreparedTarget>> prepared_ =
      std::make_shared<const std::vector<PreparedTarget>>();
  mutable std::shared_ptr<const std::map<std::string, discovery::ManagedFunction>> managed_ =
      std::make_shared<const std::map<std::string, discovery::ManagedFunction>>();
};

template <typename Op>
auto VfioDevicePreparer::Timed(const char* operation, Op op) -> decltype(op()) {
  const auto start = std::chrono::steady_clock::now();
  auto result = op();
  if (options_.metrics != nullptr) {
    options_.metrics->Observe(
        "vfio_dra_device_operation_duration_seconds", {{"operation", operation}},
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (!result.ok()) {
      options_.metrics->Increment("vfio_dra_device_operation_errors_total",
                                  {{"operation", operation}});
    }
  }
  return result;
}

}  // namespace vfio_dra::prepare
