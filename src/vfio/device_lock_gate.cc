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

Status DeviceLockGate::Run(const std::string& device, const std::string& what,
                           std::function<void()> op, std::chrono::milliseconds wait) {
  if (auto held = Held(device)) {
    return MakeError(ErrorKind::kUnavailable,
                     "PCI device " + device + " is busy: an earlier " + *held +
                         " has not returned, and the kernel holds the device until it does; " +
                         what + " is not attempted");
  }
  if (wait.count() <= 0) {
    // The caller's deadline has passed: starting now could only mark a healthy device as held.
    return MakeError(ErrorKind::kDeadlineExceeded,
                     what + " was not attempted: the caller's deadline has passed");
  }
  auto completion = std::make_shared<Completion>();
  try {
    threads_.Run([completion, registry = registry_, device, op = std::move(op)] {
      op();
      {
        std::lock_guard<std::mutex> done_lock(completion->mu);
        completion->done = true;
      }
      completion->cv.notify_all();
      std::lock_guard<std::mutex> held_lock(registry->mu);
      registry->held.erase(device);
    });
  } catch (const std::system_error& e) {
    return MakeError(ErrorKind::kUnavailable,
                     what + " was not attempted: no thread could be started for it: " + e.what());
  }
  std::unique_lock<std::mutex> lock(completion->mu);
  if (completion->cv.wait_for(lock, wait, [&] { return completion->done; })) return Status::Ok();
  lock.unlock();
  // Mark the device held unless the operation finished meanwhile. The thread never holds both
  // locks at once, so taking the registry's and then the completion's cannot deadlock.
  std::lock_guard<std::mutex> registry(registry_->mu);
  std::lock_guard<std::mutex> relock(completion->mu);
  if (completion->done) return Status::Ok();
  registry_->held[device] = {what, std::chrono::steady_clock::now() - wait};
  return MakeError(ErrorKind::kDeadlineExceeded,
                   what + " did not finish within " + std::to_string(wait.count()) + " ms");
}

Result<int> DeviceLockGate::Write(const std::string& device, const std::string& path,
                                  const std::string& value, std::chrono::milliseconds wait) {
  auto result = std::make_shared<int>(0);
  Status status = Run(
      device, "write of \"" + value + "\" to " + path,
      [result, &writer = writer_, path, value] { *result = writer.Write(path, value); }, wait);
  if (!status.ok()) return status.error();
  return *result;
}

Result<std::string> DeviceLockGate::Read(const std::string& device, const std::string& path,
                                         std::chrono::milliseconds wait) {
  auto result = std::make_shared<Result<std::string>>(std::string());
  Status status = Run(
      device, "read of " + path, [result, path] { *result = ReadFileToString(path, 64 << 10); },
      wait);
  if (!status.ok()) return status.error();
  return *result;
}

}  // namespace vfio_dra::vfio
