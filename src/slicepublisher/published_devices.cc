#include "slicepublisher/published_devices.h"

#include "base/shared_repack.h"
#include "slicepublisher/device_attributes.h"

namespace vfio_dra::slicepublisher {

void PublishedDevices::Set(const DesiredPool& pool) {
  auto devices = std::make_shared<std::map<std::string, SliceDevice>>();
  for (const SliceContent& slice : pool.slices) {
    for (const SliceDevice& device : slice.devices) (*devices)[device.name] = device;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    pool_ = pool.name;
    devices_ = std::move(devices);
  }
  known_.notify_all();
}

bool PublishedDevices::WaitForFirstPublish(std::chrono::milliseconds grace) const {
  std::unique_lock<std::mutex> lock(mu_);
  return known_.wait_until(lock, created_ + grace, [&] { return devices_ != nullptr; });
}

std::optional<SliceDevice> PublishedDevices::Find(const std::string& pool,
                                                  const std::string& device) const {
  std::shared_ptr<const std::map<std::string, SliceDevice>> devices;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pool != pool_) return std::nullopt;
    devices = devices_;
  }
  if (devices == nullptr) return std::nullopt;
  auto it = devices->find(device);
  if (it == devices->end()) return std::nullopt;
  return it->second;
}

std::map<std::string, int> PublishedDevices::CountByType() const {
  std::shared_ptr<const std::map<std::string, SliceDevice>> devices;
  {
    std::lock_guard<std::mutex> lock(mu_);
    devices = devices_;
  }
  std::map<std::string, int> counts;
  if (devices == nullptr) return counts;
  for (const auto& [name, device] : *devices) {
    counts[StringAttribute(device, attribute::kType).value_or("unknown")] += 1;
  }
  return counts;
}

void PublishedDevices::Compact() { RepackShared(mu_, devices_); }

PublishedDevices::Snapshot PublishedDevices::Current() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (devices_ == nullptr) {
    return Snapshot{"", std::make_shared<const std::map<std::string, SliceDevice>>()};
  }
  return Snapshot{pool_, devices_};
}

}  // namespace vfio_dra::slicepublisher
