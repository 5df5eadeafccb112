#include "vfio/device_lock_gate.h"

#include <condition_variable>
#include <functional>
#include <system_error>

#include "base/file_io.h"

namespace vfio_dra::vfio {

// Shared with the operations' threads, which may outlive the call (and, when abandoned, run until
// the kernel lets them return).
struct DeviceLockGate::Registry {
  struct Blocked {
    std::string what;
    std::chrono::steady_clock::time_point since;
  };
  mutable std::mutex mu;
  std::map<std::string, Blocked> held;  // device -> the operation it waits in
};

namespace {

// The threads that run operations are reused (creating one per sysfs access cost more than most
// accesses); one stuck in the kernel simply stops taking work. An idle one ends after this long.
constexpr auto kIdleThreadLifetime = std::chrono::seconds(10);

// One operation's completion, shared between the caller and its thread.
struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
};

}  // namespace

struct DeviceAccess::Progress {
  std::mutex mu;
  std::string purpose;  // of the accesses from here on, when the operation said
  std::string access;   // the one in flight
  std::string Describe() {
    std::lock_guard<std::mutex> lock(mu);
    return purpose.empty() ? access : purpose + ": " + access;
  }
};

void DeviceAccess::Step(std::string purpose) {
  std::lock_guard<std::mutex> lock(progress_->mu);
  progress_->purpose = std::move(purpose);
}

void DeviceAccess::Begin(std::string access) {
  std::lock_guard<std::mutex> lock(progress_->mu);
  progress_->access = std::move(access);
}

int DeviceAccess::Write(const std::string& path, const std::string& value) {
  Begin("write of \"" + value + "\" to " + path);
  return writer_.Write(path, value);
}

Result<std::string> DeviceAccess::Read(const std::string& path) {
  Begin("read of " + path);
  return ReadFileToString(path, 64 << 10);
}

DeviceLockGate::DeviceLockGate(sysfs::SysfsWriter& writer)
    : writer_(writer),
      registry_(std::make_shared<Registry>()),
      threads_("device-ops", kIdleThreadLifetime) {}

DeviceLockGate::~DeviceLockGate() = default;

std::optional<std::string> DeviceLockGate::Held(const std::string& device) const {
  std::lock_guard<std::mutex> lock(registry_->mu);
  auto it = registry_->held.find(device);
  if (it == registry_->held.end()) return std::nullopt;
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
      std::chrono::steady_clock::now() - it->second.since);
  return it->second.what + " (blocked in the kernel for " + std::to_string(seconds.count()) + " s)";
}

Status DeviceLockGate::Run(const std::string& device, const std::string& purpose,
                           std::function<void(DeviceAccess&)> operation,
                           std::chrono::milliseconds wait) {
  if (auto held = Held(device)) {
    return MakeError(ErrorKind::kUnavailable,
                     "PCI device " + device + " is busy: an earlier " + *held +
                         " has not returned, and the kernel holds the device until it does; " +
                         purpose + " is not attempted");
  }
  if (wait.count() <= 0) {
    // The caller's deadline has passed: starting now could only mark a healthy device as held.
    return MakeError(ErrorKind::kDeadlineExceeded,
                     purpose + " was not attempted: the caller's deadline has passed");
  }
  auto completion = std::make_shared<Completion>();
  auto progress = std::make_shared<DeviceAccess::Progress>();
  progress->access = purpose;  // until the operation's first access begins
  try {
    threads_.Run([completion, progress, registry = registry_, device, &writer = writer_,
                  operation = std::move(operation)] {
      DeviceAccess access(writer, progress);
      operation(access);
      {
        std::lock_guard<std::mutex> done_lock(completion->mu);
        completion->done = true;
      }
      completion->cv.notify_all();
      std::lock_guard<std::mutex> held_lock(registry->mu);
      registry->held.erase(device);
    });
  } catch (const std::system_error& e) {
    return MakeError(ErrorKind::kUnavailable, purpose +
                                                  " was not attempted: no thread could be started "
                                                  "for it: " +
                                                  e.what());
  }
  std::unique_lock<std::mutex> lock(completion->mu);
  if (completion->cv.wait_for(lock, wait, [&] { return completion->done; })) return Status::Ok();
  lock.unlock();
  const std::string blocked = progress->Describe();
  // Mark the device held unless the operation finished meanwhile. The thread never holds both
  // locks at once, so taking the registry's and then the completion's cannot deadlock.
  std::lock_guard<std::mutex> registry(registry_->mu);
  std::lock_guard<std::mutex> relock(completion->mu);
  if (completion->done) return Status::Ok();
  registry_->held[device] = {blocked, std::chrono::steady_clock::now() - wait};
  return MakeError(ErrorKind::kDeadlineExceeded,
                   blocked + " did not finish within " + std::to_string(wait.count()) + " ms");
}

Result<int> DeviceLockGate::Write(const std::string& device, const std::string& path,
                                  const std::string& value, std::chrono::milliseconds wait) {
  auto result = std::make_shared<int>(0);
  Status status = Run(
      device, "write of \"" + value + "\" to " + path,
      [result, path, value](DeviceAccess& access) { *result = access.Write(path, value); }, wait);
  if (!status.ok()) return status.error();
  return *result;
}

Result<std::string> DeviceLockGate::Read(const std::string& device, const std::string& path,
                                         std::chrono::milliseconds wait) {
  auto result = std::make_shared<Result<std::string>>(std::string());
  Status status = Run(
      device, "read of " + path,
      [result, path](DeviceAccess& access) { *result = access.Read(path); }, wait);
  if (!status.ok()) return status.error();
  return *result;
}

}  // namespace vfio_dra::vfio
