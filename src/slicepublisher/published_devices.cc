#include "slicepublisher/published_devices.h"

#include "base/shared_repack.h"
#include "slicepublisher/device_attributes.h"

namespace vfio_dra::slicepublisher {

void PublishedDevices::Set(const DesiredPool& pool) {
  std::vector<const SliceDevice*> all;
  for (const SliceContent& slice : pool.slices) {
    for (const SliceDevice& device : slice.devices) all.push_back(&device);
  }
  auto devices = std::make_shared<const PackedDeviceTable>(all);
  // Counted from the table, where a name appears once.
  std::map<std::string, int> counts;
  devices->ForEach([&](const SliceDevice& device) {
    counts[StringAttribute(device, attribute::kType).value_or("unknown")] += 1;
  });
  {
    std::lock_guard<std::mutex> lock(mu_);
    pool_ = pool.name;
    devices_ = std::move(devices);
    count_by_type_ = std::move(counts);
    taint_reasons_ = std::make_shared<const std::map<std::string, std::string>>(pool.taint_reasons);
    counter_sets_ =
        std::make_shared<const std::map<std::string, CounterSet>>(CounterSetsOf(pool.slices));
  }
  known_.notify_all();
}

bool PublishedDevices::WaitForFirstPublish(std::chrono::milliseconds grace) const {
  std::unique_lock<std::mutex> lock(mu_);
  return known_.wait_until(lock, created_ + grace, [&] { return devices_ != nullptr; });
}

std::optional<SliceDevice> PublishedDevices::Find(const std::string& pool,
                                                  const std::string& device) const {
  std::shared_ptr<const PackedDeviceTable> devices;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pool != pool_) return std::nullopt;
    devices = devices_;
  }
  if (devices == nullptr) return std::nullopt;
  return devices->Find(device);
}

std::map<std::string, int> PublishedDevices::CountByType() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_by_type_;
}

void PublishedDevices::Compact() { RepackShared(mu_, devices_); }

PublishedDevices::Snapshot PublishedDevices::Current() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (devices_ == nullptr) {
    return Snapshot{"", std::make_shared<const PackedDeviceTable>(),
                    std::make_shared<const std::map<std::string, std::string>>(),
                    std::make_shared<const std::map<std::string, CounterSet>>()};
  }
  return Snapshot{pool_, devices_, taint_reasons_, counter_sets_};
}

std::map<std::string, CounterSet> CounterSetsOf(const std::vector<SliceContent>& slices) {
  std::map<std::string, CounterSet> sets;
  for (const SliceContent& slice : slices) {
    for (const CounterSet& set : slice.shared_counters) sets[set.name] = set;
  }
  return sets;
}

}  // namespace vfio_dra::slicepublisher
