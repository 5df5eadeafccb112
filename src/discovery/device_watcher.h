// DeviceWatcher: notices changes to the node's devices and hands a fresh NodeScan to the
// publisher. Kernel uevents (libudev, "kernel" source: no udevd needed inside the container) for
// the pci, mdev and vfio subsystems trigger a rescan after a short quiet period; a periodic
// rescan is the safety net for anything the events miss: each period a cheap probe of what can
// change (ChangeProbe) decides whether a full scan is needed, and a full scan runs at least every
// full_rescan_interval whatever the probe says. A scan is handed on only when it differs from the
// last one handed on; the watcher keeps only that scan's fingerprint, not the scan: whoever needs
// it after the hand-over keeps it (or the part it needs).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "base/log.h"
#include "discovery/node_scan.h"

namespace vfio_dra::discovery {

struct DeviceWatcherOptions {
  // How often the periodic check runs (a probe when one is given, else a full scan).
  std::chrono::milliseconds rescan_interval{std::chrono::seconds(30)};
  // The longest time between two full scans when a probe is given.
  std::chrono::milliseconds full_rescan_interval{std::chrono::minutes(10)};
  std::chrono::milliseconds quiet_period{std::chrono::milliseconds(200)};
  bool listen_for_uevents = true;
  // Runs on the watcher's thread when the node has settled after a change (the first periodic
  // check that finds nothing new), before the watcher returns freed memory to the system: the
  // moment to repack long-lived state built while the heap was full of short-lived data.
  std::function<void()> on_settled;
};

class DeviceWatcher {
 public:
  using Scanner = std::function<std::shared_ptr<const NodeScan>()>;
  using Listener = std::function<void(std::shared_ptr<const NodeScan>)>;
  // A cheap digest of the device state (ChangeProbe); equal digests let the periodic check
  // skip the full scan.
  using Probe = std::function<uint64_t()>;

  DeviceWatcher(Scanner scanner, Listener listener, DeviceWatcherOptions options, Logger log,
                Probe probe = nullptr);
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
  // Full scans run so far, and periodic checks the probe answered without one (for tests and the
  // benchmark).
  int full_scans() const { return full_scans_; }
  int skipped_scans() const { return skipped_scans_; }
  // Full scans asked for by a uevent or Trigger, and periodic checks run (whether they scanned):
  // the metrics, and a test's barrier (a trigger's rescan is due before a later periodic check).
  int event_scans() const { return event_scans_; }
  int periodic_checks() const { return periodic_checks_; }

 private:
  void Run();
  void RescanAndPublish();
  // The periodic check: a full scan unless the probe says nothing changed since the last one.
  void PeriodicCheck();

  Scanner scanner_;
  Listener listener_;
  DeviceWatcherOptions options_;
  Probe probe_;
  uint64_t last_probe_ = 0;
  std::chrono::steady_clock::time_point last_full_scan_{};
  std::atomic<int> full_scans_{0};
  std::atomic<int> skipped_scans_{0};
  std::atomic<int> event_scans_{0};
  std::atomic<int> periodic_checks_{0};
  bool settled_since_scan_ = false;  // only touched by the watching thread
  bool last_scan_complete_ = false;  // the last full scan had no warnings
  Logger log_;
  int wake_fd_ = -1;  // eventfd: Trigger and Stop
  std::atomic<bool> stopping_{false};
  std::atomic<bool> triggered_{false};
  std::atomic<bool> uevents_active_{false};
  std::thread thread_;
  // Only touched by the thread that scans (Start's caller, then the watching thread).
  std::optional<Sha256> handed_on_;  // fingerprint of the last scan handed on
};

}  // namespace vfio_dra::discovery
