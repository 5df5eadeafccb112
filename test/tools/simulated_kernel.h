// SimulatedKernel: the kernel side of sysfs for tests. It implements the daemon's SysfsWriter and
// changes a fixture tree (test/fixtures) the way the kernel would for the writes vfio-dra makes:
// driver_override, a driver's bind/unbind, drivers_probe, mdev create/remove, sriov_numvfs and the
// vGPU type of an NVIDIA vGPU VF (nvidia/current_vgpu_type: an ID creates, 0 destroys; -EBUSY
// while a VMM has the VF open, -ENODEV for an ID the VF does not list as creatable; the siblings'
// creatable_vgpu_types shrink as vGPUs are made, one type per PF; such a VF stays on nvidia,
// which is its VFIO provider: it has vfio-dev/ and a /dev/vfio/<group> node),
// including the uevent DRIVER line, /sys/class/vfio, vfio-dev cdevs, the /dev/vfio nodes (real
// character devices made with mknod, so the daemon's checks run as on a node) and mdev
// available_instances (NVIDIA's one-type-per-parent rule; other vendors count space, as mtty and
// GVT-g do, so an instance of one type lowers what the others offer). It injects faults (a bind
// that fails, an unbind that hangs, an mdev create without capacity, a device that vanishes) and
// logs every write, so tests can check that nothing outside the managed devices' attributes was
// written. What the tree cannot hold (which host driver matches a device) is kept next to it in
// "<sysfs root>.sim.json", so a restarted daemon process sees the same kernel.
//
// The device lock, as the kernel has it during an unbind that waits for a VFIO user: the driver
// links go first (driver_sysfs_remove runs before the driver's remove()), then the device lock is
// held until the user lets go. While it is held, reads of the device's lock-taking attributes
// (driver_override, sriov_numvfs, and uevent, whose show takes the lock in the stable kernels
// since its race with driver detach was fixed: Debian's 6.1 on the QEMU node blocks it) block, and
// so do writes to them, binds, unbinds and probes of the device and removes of its mdevs. Reads
// block through the file system, for any process: the attributes are replaced by FIFOs that the
// holder keeps open, so open() succeeds and read() waits; on release the files come back and a
// blocked reader gets the value (or, when several wait, end of file: the one difference from the
// kernel, which gives each the value). A FIFO at driver_override is the lock as other simulated
// kernels (other processes) see it.
//
// Concurrency, as the kernel's: writes that act on one device (its driver_override, a bind,
// unbind or probe of it) wait for each other and run beside writes to other devices; the nodes
// every device shares (vfio-dev numbers, a group's /dev/vfio node) are handed out one binder at
// a time. Writes that add or remove devices (sriov_numvfs, mdev create and remove) run alone.
// A write blocked in a hang holds only its device.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <vector>

#include "sysfs/sysfs_reader.h"
#include "sysfs/sysfs_writer.h"
#include "sysfs_fixture.h"

namespace vfio_dra::testing {

struct SimWrite {
  std::string path;  // relative to the sysfs root
  std::string value;
  int result = 0;  // errno returned to the writer
};

// Whether `write` is one the daemon may make for these devices: a managed function's
// driver_override, a driver's bind/unbind with a managed function as the value, and, for each
// mdev type directory in `mdev_types` (relative to the root), its create file and any instance's
// remove file.
bool IsManagedWrite(const SimWrite& write, const std::set<std::string>& functions,
                    const std::set<std::string>& mdev_types = {});

class SimulatedKernel final : public sysfs::SysfsWriter {
 public:
  // Creates <dev root>/vfio/vfio (10:196) and, on first use of a tree, records each function's
  // bound driver as the host driver that matches it. Throws when nodes cannot be made (mknod
  // needs CAP_MKNOD).
  SimulatedKernel(std::string sysfs_root, std::string dev_root);
  // Releases hanging writes and waits for them to return.
  ~SimulatedKernel() override;
  SimulatedKernel(const SimulatedKernel&) = delete;
  SimulatedKernel& operator=(const SimulatedKernel&) = delete;

  int Write(const std::string& path, std::string_view value) override;
  // Opens the fixture file for writing without writing, as the kernel's sysfs would: ENOENT for
  // a missing attribute, the errno of a DenyWrites path.
  int ProbeWritable(const std::string& path) override;

  // Faults.
  void FailVfioBind(const std::string& address, int err);  // every bind to vfio-pci
  void HangUnbind(const std::string& address);             // unbinds block until ReleaseHangs
  // Binds of the function to a VFIO driver block, with the device locked, until ReleaseHangs: a
  // probe that waits (for a reset, say). Its driver links appear once it returns (the kernel
  // makes them just before the probe).
  void HangVfioBind(const std::string& address);
  void ReleaseHangs();
  void FailMdevCreate(int err);  // the next mdev create
  // A VMM opens (or lets go of) an NVIDIA vGPU VF: while it is open, writes to its
  // current_vgpu_type fail with EBUSY. Kept next to the tree, so every process's kernel sees it.
  void OpenVgpuVf(const std::string& address);
  void CloseVgpuVf(const std::string& address);
  void RemoveDevice(const std::string& address);  // hot-unplug: the function vanishes
  // Writes (and ProbeWritable) to `relative` and to everything under it fail with `err` before
  // the kernel sees them: EROFS as on a read-only /sys mount, EACCES as under an AppArmor profile
  // that denies the path. An empty `relative` denies the whole tree.
  void DenyWrites(const std::string& relative, int err);
  // Writes currently blocked in a hang.
  int Hanging() const;
  bool WaitUntilHanging(int count, std::chrono::milliseconds timeout) const;
  // Waits until no write is in progress (for example after ReleaseHangs).
  void WaitIdle() const;
  // SIGKILLs this process once no write is halfway through (writes parked in a hang excepted),
  // and lets none start meanwhile. A process killed during a sysfs write does not stop the kernel
  // halfway through a bind; without this, the simulation's bookkeeping of one would be.
  [[noreturn]] void KillProcessBetweenWrites() const;

  std::vector<SimWrite> Writes() const;
  // Also append every write as a JSON line to `path` (for daemons in other processes).
  void LogWritesTo(std::string path) { log_file_ = std::move(path); }
  // The writes a LogWritesTo file holds, in order.
  static std::vector<SimWrite> ReadWriteLog(const std::string& path);

 private:
  // Writes that act on one device hold the tree shared; writes that add or remove devices hold
  // it alone.
  using TreeLock = std::shared_lock<std::shared_mutex>;
  int Apply(const std::vector<std::string>& parts, const std::string& rel, const std::string& arg);
  int ApplyToOneDevice(const std::vector<std::string>& parts, const std::string& rel,
                       const std::string& arg);
  int Bind(const std::string& driver, const std::string& address, TreeLock& tree);
  int Unbind(const std::string& driver, const std::string& address, TreeLock& tree);
  int Probe(const std::string& address, TreeLock& tree);
  int CreateMdev(const std::string& parent_dir, const std::string& type, const std::string& uuid);
  int RemoveMdev(const std::string& uuid);
  int SetNumVfs(const std::string& address, const std::string& value);
  void DisableVfs(const std::string& address);
  void RemoveFunction(const std::string& address);
  // A write of `value` to the VF's nvidia/current_vgpu_type.
  int SetVgpuType(const std::string& vf, const std::string& value);
  // Rewrites creatable_vgpu_types of every VF of `pf` from the VFs' current types.
  void RecomputeCreatableVgpuTypes(const std::string& pf);
  // The VFIO side of a device: its vfio-dev cdev and its group's node.
  void AddVfioNodes(const std::string& dir);

  // The device lock (see the header comment). Called with mu_ held.
  void LockDevice(const std::string& address);
  void UnlockDevice(const std::string& address);
  bool DeviceLocked(const std::string& address) const;
  // Holds `address` locked until ReleaseHangs, with `tree` let go meanwhile.
  void HoldUntilReleased(const std::string& address, TreeLock& tree);
  // Waits, holding nothing, until `address` is not locked by another process.
  void WaitWhileLocked(const std::string& address);
  // The PCI device a write to `rel` with `arg` acts on ("" when none).
  std::string TargetDevice(const std::vector<std::string>& parts, const std::string& rel,
                           const std::string& arg) const;

  void AddBootTimeNodes();
  void DoBind(const std::string& driver, const std::string& address);
  void DoUnbind(const std::string& driver, const std::string& address);
  std::string DeviceDir(const std::string& address) const;  // real dir, relative to the root
  std::string DriverOf(const std::string& address) const;
  std::string OverrideOf(const std::string& address) const;
  int GroupOf(const std::string& rel_device_link) const;
  int NextGroup() const;
  // Takes the lowest free vfio-dev number for the device at `dir` and links it from
  // /sys/class/vfio-dev; returns its name ("vfio3"). nodes_mu_ held.
  std::string ClaimVfioDev(const std::string& dir);
  void SetUeventDriver(const std::string& dir, const std::string& driver);
  void MakeNode(const std::string& dev_relative, int major, int minor) const;
  void RemoveNode(const std::string& dev_relative) const;
  void SaveState() const;
  void LoadState();
  std::string Abs(const std::string& rel) const { return root_ + "/" + rel; }

  std::string root_;
  sysfs::SysfsReader tree_;  // reads of the simulated tree (links, listings), as the daemon's
  std::string dev_root_;
  std::string state_file_;
  std::string log_file_;

  std::shared_mutex tree_mu_;  // taken before mu_ when both are held
  std::mutex nodes_mu_;        // vfio-dev numbers and group nodes; taken last
  // Every vfio-dev number below it is taken, as far as this process knows (numbers another process
  // frees are not reused before higher ones; the class link still keeps each one unshared).
  int vfio_dev_hint_ = 0;  // nodes_mu_
  mutable std::mutex mu_;  // what follows, and the counts
  mutable std::condition_variable cv_;
  std::set<std::string> busy_;                      // devices a write of this process acts on
  std::map<std::string, std::string> host_driver_;  // address -> matching host driver
  std::map<std::string, std::map<std::string, int>> mdev_max_;  // parent dir -> type -> max
  std::set<std::string> mdev_mixed_;  // NVIDIA parents in heterogeneous mode (count space)
  std::map<std::string, std::vector<VgpuVfTypeSpec>> vgpu_vf_types_;  // PF address -> its types
  // Rewrites every type's available_instances of a parent from what exists on it.
  void RecomputeAvailable(const std::string& parent_dir);
  std::map<std::string, int> fail_bind_;
  std::set<std::string> hang_unbind_;
  std::set<std::string> hang_bind_;
  bool released_ = false;
  int hanging_ = 0;
  int in_flight_ = 0;
  int fail_mdev_create_ = 0;
  std::map<std::string, int> denied_;  // DenyWrites: relative path -> errno
  // The errno DenyWrites set for `rel`, or 0. Called without mu_.
  int DeniedError(const std::string& rel) const;
  struct HeldAttribute {
    std::string name;     // relative to the device directory
    std::string content;  // what the attribute read before the lock
    int fd = -1;          // the FIFO, held open read-write so readers' open() never blocks
  };
  std::map<std::string, std::vector<HeldAttribute>> locked_;  // address -> its FIFOs
  std::vector<SimWrite> writes_;
};

}  // namespace vfio_dra::testing
