// VgpuLayoutApplier: makes the vGPUs of each GPU's declared `create: ahead` layout exist
// (AdminPolicy::vgpu_layouts), so that discovery publishes each as a device of its own and the
// scheduler is offered only vGPUs that exist. For a GPU (an NVIDIA SR-IOV PF on nvidia with vGPU
// VFs) whose VFs hold only vGPUs of the layout's type T (or none) and fewer than its count (or, for
// `max`, while a free VF still lists T), it writes T to free VFs in address order until the count
// exists or the driver refuses (ENODEV: the GPU is full).
// Invariants:
// - It never destroys or changes a vGPU: a GPU that runs another type is left alone (and logged
//   once), vGPUs of T beyond the count stay.
// - It writes only to a VF whose device lock it holds (with the PF's: the lock prepare takes for a
//   vGPU of this GPU), after reading the checkpoint with those locks held, and never to a VF a
//   claim's record names: no prepare, unprepare or recovery can be working on what it writes.
//   Locks are only tried: a GPU whose locks are busy is left for the next pass.
// - A vGPU it makes has no record: a claim allocated it is handed it as an existing vGPU
//   (CheckHolds) and unprepare leaves it in place; recovery has nothing of it to undo.
// - Whatever a pass is cut short by (a crash between two writes, a busy VF), the GPU still holds
//   only T and fewer than the count, which is the trigger: the next pass tops it up.
// Each problem with a GPU is logged once, again only when it changes.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/result.h"
#include "discovery/admin_policy.h"
#include "discovery/inventory.h"
#include "prepare/prepare_checkpoint.h"
#include "prepare/prepare_locks.h"
#include "sysfs/sysfs_reader.h"
#include "sysfs/sysfs_writer.h"
#include "vfio/device_lock_gate.h"
#include "vfio/vgpu_vf_lifecycle.h"

namespace vfio_dra::prepare {

struct VgpuLayoutOptions {
  std::string plugin_data_dir;  // where the PrepareLocks live
  // The longest a write of a VF's type may take, and a wait for the call and decision locks.
  std::chrono::milliseconds write_timeout{std::chrono::seconds(20)};
  std::chrono::milliseconds lock_wait{std::chrono::seconds(1)};
  // Called with "vgpu-layout:<VF>" before each write (tests kill the daemon there); may be empty.
  std::function<void(const std::string&)> before_step;
};

// What one pass did.
struct VgpuLayoutPass {
  int created = 0;     // vGPUs made: the node's devices changed
  bool retry = false;  // a layout is unmet for a reason that may pass (a lock or a VF busy)
};

class VgpuLayoutApplier {
 public:
  // `policy`, `sysfs`, `writer` and `checkpoint` must outlive the applier.
  static Result<std::unique_ptr<VgpuLayoutApplier>> Open(VgpuLayoutOptions options,
                                                         const discovery::AdminPolicy& policy,
                                                         const sysfs::SysfsReader& sysfs,
                                                         sysfs::SysfsWriter& writer,
                                                         const PrepareCheckpoint& checkpoint,
                                                         Logger log);

  // Whether the policy declares any layout this applier acts on.
  bool HasWork() const;
  // One pass over the GPUs of `inventory` (a scan of the node). One pass at a time.
  VgpuLayoutPass Apply(const discovery::Inventory& inventory);

 private:
  // One GPU as the scan shows it, with its layout.
  struct Gpu {
    std::string pf;
    std::vector<std::string> vfs;  // its vGPU VFs, by address
    const discovery::VgpuLayout* layout = nullptr;
    int type_id = 0;  // the layout's type, resolved
  };
  VgpuLayoutApplier(VgpuLayoutOptions options, const discovery::AdminPolicy& policy,
                    const sysfs::SysfsReader& sysfs, sysfs::SysfsWriter& writer,
                    const PrepareCheckpoint& checkpoint, PrepareLocks locks, Logger log);

  // The GPUs of the inventory that have a `create: ahead` layout.
  std::vector<Gpu> GpusWithLayouts(const discovery::Inventory& inventory) const;
  // Whether the scan says the GPU's layout is unmet and may be met by writing: logs (once) why
  // not when it never can be as things are.
  // Resolves gpu.type_id.
  bool Unmet(Gpu& gpu, const discovery::Inventory& inventory);
  // Takes the locks, re-reads the VFs and writes; adds to `pass`.
  void Fill(const Gpu& gpu, const discovery::Inventory& inventory, VgpuLayoutPass& pass);
  // With the locks held: writes T to `free` in order until the count exists or the driver
  // refuses; `existing` counts up.
  void Write(const Gpu& gpu, const std::vector<std::string>& free, int& existing,
             VgpuLayoutPass& pass);
  // Logs (once) why the GPU holds fewer than its layout asks and no write can help now: the driver
  // creates no more (`gpu_full`), or no free VF is left.
  void NoteShort(const Gpu& gpu, int existing, bool gpu_full);
  bool Denied(const discovery::PciFunction& vf, int type_id) const;
  // Logs `message` as a warning (or info) for `pf` unless it is what was logged for it last.
  void NoteOnce(const std::string& pf, const std::string& message, bool warning = true);
  void Forget(const std::string& pf) { noted_.erase(pf); }

  VgpuLayoutOptions options_;
  const discovery::AdminPolicy& policy_;
  const sysfs::SysfsReader& sysfs_;
  const PrepareCheckpoint& checkpoint_;
  PrepareLocks locks_;
  vfio::DeviceLockGate gate_;
  vfio::VgpuVfLifecycle vgpus_;
  Logger log_;
  std::mutex mu_;                             // one pass at a time
  std::map<std::string, std::string> noted_;  // by PF: what was logged last
  std::map<std::string, int> type_ids_;       // "<PF> <layout type>" -> its ID, once listed
};

}  // namespace vfio_dra::prepare
