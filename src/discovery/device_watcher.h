// DeviceWatcher: notices changes to the node's devices and hands a fresh NodeScan to the
// publisher. Kernel uevents (libudev, "kernel" source: no udevd needed inside the container) for
// the pci, mdev and vfio subsystems trigger a rescan after a short quiet period; a periodic
// rescan is the safety net for anything the events miss. A scan is handed on only when it differs
// from the last one handed on.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "base/log.h"
#include "discovery/node_scan.h"

namespace vfio_dra::discovery {

struct DeviceWatcherOptions {
  std::chrono::milliseconds rescan_interval{std::chrono::seconds(30)};
  std::chrono::milliseconds quiet_period{std::chrono::milliseconds(200)};
  bool listen_for_uevents = true;
};

class DeviceWatcher {
 public:
  using Scanner = std::function<std::shared_ptr<const NodeScan>()>;
  using Listener = std::function<void(std::shared_ptr<const NodeScan>)>;

  DeviceWatcher(Scanner scanner, Listener listener, DeviceWatcherOptions options, Logger log);
  ~DeviceWatcher();
  DeviceWatcher(const DeviceWatcher&) = delete;
  DeviceWatcher& operator=(const DeviceWatcher&) = delete;

  // Scans once synchronously (the listener sees the first scan before Start returns), then
  // watches on a thread.
  void Start();
  void Stop();
  // Asks for a rescan after the quiet period (as a uevent would).
  void Trigger();
  bool uevents_active() const { return uevents_active_; }
  std::shared_ptr<const NodeScan> Latest() const;

 private:
  void Run();
  void RescanAndPublish();

  Scanner scanner_;
  Listener listener_;
  DeviceWatcherOptions options_;
  Logger log_;
  int wake_fd_ = -1;  // eventfd: Trigger and Stop
  std::atomic<bool> stopping_{false};
  std::atomic<bool> triggered_{false};
  std::atomic<bool> uevents_active_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  std::shared_ptr<const NodeScan> latest_;
  std::string latest_fingerprint_;
};

}  // namespace vfio_dra::discovery
