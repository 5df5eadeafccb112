#include "discovery/device_watcher.h"

#include <libudev.h>
#include <malloc.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>

#include "base/thread_name.h"

namespace vfio_dra::discovery {

DeviceWatcher::DeviceWatcher(Scanner scanner, Listener listener, DeviceWatcherOptions options,
                             Logger log, Probe probe)
    : scanner_(std::move(scanner)),
      listener_(std::move(listener)),
      options_(std::move(options)),
      probe_(std::move(probe)),
      log_(std::move(log)),
      wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

DeviceWatcher::~DeviceWatcher() {
  Stop();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void DeviceWatcher::RescanAndPublish() {
  // The probe is taken before the scan: a change in between shows up as a new digest next time.
  if (probe_) last_probe_ = probe_();
  last_full_scan_ = std::chrono::steady_clock::now();
  ++full_scans_;
  settled_since_scan_ = false;
  auto scan = scanner_();
  // A scan that could not read everything (a device half-way through appearing, say) is not a
  // base the probe may vouch for: the next periodic check scans in full again.
  last_scan_complete_ = scan->inventory.warnings.empty();
  const Sha256 fingerprint = Fingerprint(*scan);
  if (handed_on_ == fingerprint) {
    // An unchanged rescan's allocations are all freed now; hand the pages back instead of
    // letting the idle daemon's heap keep a second scan's worth of memory.
    scan.reset();
    ::malloc_trim(0);
    return;
  }
  handed_on_ = fingerprint;
  for (const std::string& warning : scan->inventory.warnings) {
    log_.Warn("device scan", {{"warning", warning}});
  }
  log_.Info("devices changed",
            {{"published_pci", std::to_string(scan->selection.devices.size())},
             {"published_mdev_types", std::to_string(scan->selection.mdev_types.size())}});
  listener_(std::move(scan));
}

void DeviceWatcher::PeriodicCheck() {
  if (probe_ && last_scan_complete_ &&
      std::chrono::steady_clock::now() - last_full_scan_ < options_.full_rescan_interval &&
      probe_() == last_probe_) {
    ++skipped_scans_;
    if (!settled_since_scan_) {
      // The node has settled since the last full scan (and its publish): the pages of that scan
      // and of the slices built from it go back below instead of staying at the peak for good.
      if (options_.on_settled) options_.on_settled();
      settled_since_scan_ = true;
    }
    // Every quiet check, not only the first: what the idle daemon frees in between (a watch's
    // events, a reconnect's TLS state, the probe's own reads) otherwise stays resident, about
    // 0.4 MiB of a 16 MiB budget (daemon_bench). The price is the page faults of the next work
    // that reuses those pages, 0.01 to 0.015% of a core (daemon_bench; most of it in the
    // slice-sync thread).
    ::malloc_trim(0);
    return;
  }
  RescanAndPublish();
}

void DeviceWatcher::Start() {
  RescanAndPublish();
  thread_ = std::thread([this] {
    NameThisThread("device-watcher");
    Run();
  });
}

void DeviceWatcher::Stop() {
  if (!thread_.joinable()) return;
  stopping_ = true;
  const uint64_t one = 1;
  (void)::write(wake_fd_, &one, sizeof one);
  thread_.join();
}

void DeviceWatcher::Trigger() {
  triggered_ = true;
  const uint64_t one = 1;
  (void)::write(wake_fd_, &one, sizeof one);
}

void DeviceWatcher::Run() {
  udev* udev_ctx = nullptr;
  udev_monitor* monitor = nullptr;
  if (options_.listen_for_uevents) {
    udev_ctx = udev_new();
    monitor = udev_ctx ? udev_monitor_new_from_netlink(udev_ctx, "kernel") : nullptr;
    if (monitor != nullptr) {
      for (const char* subsystem : {"pci", "mdev", "vfio", "mdev_bus"}) {
        udev_monitor_filter_add_match_subsystem_devtype(monitor, subsystem, nullptr);
      }
      if (udev_monitor_enable_receiving(monitor) != 0) {
        udev_monitor_unref(monitor);
        monitor = nullptr;
      }
    }
    if (monitor == nullptr) {
      log_.Warn("kernel uevents unavailable; relying on the periodic rescan",
                {{"interval_ms", std::to_string(options_.rescan_interval.count())}});
    } else {
      uevents_active_ = true;
    }
  }
  using Clock = std::chrono::steady_clock;
  auto next_periodic = Clock::now() + options_.rescan_interval;
  bool has_pending = false;
  Clock::time_point pending{};
  while (!stopping_) {
    auto deadline = next_periodic;
    if (has_pending && pending < deadline) deadline = pending;
    const auto wait =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd fds[2] = {{wake_fd_, POLLIN, 0},
                     {monitor ? udev_monitor_get_fd(monitor) : -1, POLLIN, 0}};
    const int ready =
        ::poll(fds, monitor ? 2 : 1, std::max<int>(0, static_cast<int>(wait.count())));
    if (stopping_) break;
    if (ready > 0 && (fds[0].revents & POLLIN)) {
      uint64_t value = 0;
      (void)::read(wake_fd_, &value, sizeof value);
      if (triggered_.exchange(false) && !has_pending) {
        has_pending = true;
        pending = Clock::now() + options_.quiet_period;
      }
    }
    if (monitor && ready > 0 && (fds[1].revents & POLLIN)) {
      while (udev_device* dev = udev_monitor_receive_device(monitor)) {
        auto text = [](const char* value) { return value != nullptr ? value : ""; };
        log_.Debug(3, "uevent",
                   {{"action", text(udev_device_get_action(dev))},
                    {"path", text(udev_device_get_syspath(dev))}});
        udev_device_unref(dev);
      }
      if (!has_pending) {
        has_pending = true;
        pending = Clock::now() + options_.quiet_period;
      }
    }
    const auto now = Clock::now();
    if (has_pending && now >= pending) {
      has_pending = false;
      next_periodic = now + options_.rescan_interval;
      RescanAndPublish();
      ++event_scans_;
    } else if (now >= next_periodic) {
      next_periodic = now + options_.rescan_interval;
      PeriodicCheck();
      ++periodic_checks_;
    }
  }
  if (monitor) udev_monitor_unref(monitor);
  if (udev_ctx) udev_unref(udev_ctx);
}

}  // namespace vfio_dra::discovery
