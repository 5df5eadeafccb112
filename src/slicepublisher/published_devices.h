// PublishedDevices: the devices this node offers right now, by name, as the publisher last built
// them. Device preparation looks allocated devices up here: the scheduler allocated what was
// published, so what was published (PCI address, IDs, IOMMU group, mdev UUID) is what prepare
// re-checks against sysfs. Thread-safe; readers get a snapshot. The devices are kept packed (see
// PackedDeviceTable): they live as long as the daemon.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "slicepublisher/packed_device_table.h"
#include "slicepublisher/slice_model.h"

namespace vfio_dra::slicepublisher {

class PublishedDevices {
 public:
  void Set(const DesiredPool& pool);
  // Waits for the first Set until `grace` after this object was made (a prepare can arrive right
  // after a restart, before the first publish); false when that time has passed. Measured from
  // the start, so that while the API server is unreachable calls fail fast instead of each
  // waiting in turn.
  bool WaitForFirstPublish(std::chrono::milliseconds grace) const;
  std::optional<SliceDevice> Find(const std::string& pool, const std::string& device) const;
  // Published devices by their `type` attribute (gpu, mdev, vf, hostdev).
  std::map<std::string, int> CountByType() const;

  struct Snapshot {
    std::string pool;                                  // empty before the first publish
    std::shared_ptr<const PackedDeviceTable> devices;  // never null
    // Why each tainted device is tainted (DesiredPool::taint_reasons); never null.
    std::shared_ptr<const std::map<std::string, std::string>> taint_reasons;
    // The published counter sets by name (a kept device consumes from them); never null.
    std::shared_ptr<const std::map<std::string, CounterSet>> counter_sets;
  };
  Snapshot Current() const;
  // Copies the table anew and drops the old copy (readers holding a snapshot keep theirs). The
  // table Set made sits among the publish's short-lived data; once the node has settled and that
  // data is gone, a fresh copy can sit where the old one does not pin those pages (malloc_trim).
  // Content is unchanged.
  void Compact();

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable known_;
  const std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
  std::string pool_;
  std::shared_ptr<const PackedDeviceTable> devices_;
  std::map<std::string, int> count_by_type_;
  std::shared_ptr<const std::map<std::string, std::string>> taint_reasons_;
  std::shared_ptr<const std::map<std::string, CounterSet>> counter_sets_;
};

// The counter sets of `slices` by name.
std::map<std::string, CounterSet> CounterSetsOf(const std::vector<SliceContent>& slices);

}  // namespace vfio_dra::slicepublisher
