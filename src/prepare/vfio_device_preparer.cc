// VfioDevicePreparer's construction and the reads every phase shares. The phases live in files
// of their own: prepare_decision.cc (Prepare, deciding and recording the start), prepare_checks.cc
// (what a decision refuses), prepare_apply.cc (the node changes, CDI spec and metadata),
// prepare_undo.cc (Unprepare and the undo of a record), prepare_recovery.cc (start-up recovery)
// and preparer_snapshots.cc (the counts, prepared devices and held functions other threads read).
#include "prepare/vfio_device_preparer.h"

#include <fmt/format.h>

#include "sysfs/sysfs_parse.h"

namespace vfio_dra::prepare {

Result<std::unique_ptr<VfioDevicePreparer>> VfioDevicePreparer::Open(
    PreparerOptions options, const sysfs::SysfsReader& sysfs, sysfs::SysfsWriter& writer,
    const slicepublisher::PublishedDevices& published, Logger log) {
  auto boot_id = ReadBootId(options.boot_id_file);
  if (!boot_id.ok()) return boot_id.error();
  auto checkpoint =
      PrepareCheckpoint::Open(options.plugin_data_dir, *boot_id, options.checkpoint_sync);
  if (!checkpoint.ok()) return checkpoint.error();
  if (const auto unwatched = checkpoint->unwatched()) {
    // Still correct, only slower: every prepare reads every record.
    log.Warn("prepare checkpoint not watched for changes", {{"problem", *unwatched}});
  }
  auto locks = PrepareLocks::Open(options.plugin_data_dir);
  if (!locks.ok()) return locks.error();
  return std::unique_ptr<VfioDevicePreparer>(
      new VfioDevicePreparer(std::move(options), sysfs, writer, published, std::move(*checkpoint),
                             std::move(*locks), std::move(log)));
}

VfioDevicePreparer::VfioDevicePreparer(PreparerOptions options, const sysfs::SysfsReader& sysfs,
                                       sysfs::SysfsWriter& writer,
                                       const slicepublisher::PublishedDevices& published,
                                       PrepareCheckpoint checkpoint, PrepareLocks locks, Logger log)
    : options_(std::move(options)),
      sysfs_(sysfs),
      published_(published),
      checkpoint_(std::move(checkpoint)),
      locks_(std::move(locks)),
      gate_(writer),
      binder_(sysfs, gate_,
              vfio::BinderOptions{options_.unbind_timeout, options_.dev_root, "/proc",
                                  options_.holders_gap}),
      mdevs_(sysfs, writer, gate_, options_.unbind_timeout),
      vgpus_(sysfs, gate_, options_.unbind_timeout),
      nodes_(sysfs, options_.dev_root),
      vf_network_(options_.vf_network, options_.pods, log.WithComponent("vf-network")),
      cdi_(options_.cdi_dir),
      metadata_(options_.plugin_data_dir, cdi::SpecDirectory(options_.cdi_dir),
                options_.driver_name),
      kind_(options_.driver_name + "/vfio"),
      log_(std::move(log)) {}

void VfioDevicePreparer::Step(const std::string& name) const {
  if (options_.before_step) options_.before_step(name);
}

std::string VfioDevicePreparer::SpecFileName(const std::string& claim_uid) const {
  return cdi::TransientSpecFileName(kind_, claim_uid);
}

Result<PciIdentity> VfioDevicePreparer::ReadIdentity(const std::string& address) const {
  // One read of modalias, which carries all four IDs (and, unlike uevent, takes no device lock).
  const std::string path = "bus/pci/devices/" + address + "/modalias";
  auto text = sysfs_.Read(path);
  if (!text.ok()) return text.error().Wrap("cannot read the identity of PCI " + address);
  auto ids = sysfs::ParsePciModalias(*text);
  if (!ids.ok()) {
    return ids.error().Wrap("cannot read the identity of PCI " + address + ": " +
                            sysfs_.Path(path));
  }
  // As the vendor, device and subsystem files have them, without 0x: records compare equal
  // across versions.
  return PciIdentity{fmt::format("{:04x}", ids->vendor), fmt::format("{:04x}", ids->device),
                     fmt::format("{:04x}", ids->subsystem_vendor),
                     fmt::format("{:04x}", ids->subsystem_device)};
}

}  // namespace vfio_dra::prepare
