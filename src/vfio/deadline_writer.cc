#include "vfio/deadline_writer.h"

#include <cerrno>
#include <condition_variable>
#include <thread>

namespace vfio_dra::vfio {

// Shared between the waiting caller and the writing thread, which may outlive the call.
struct DeadlineWriter::InFlight {
  std::mutex mu;
  std::condition_variable done_cv;
  bool done = false;
  int result = 0;
};

DeadlineWriter::DeadlineWriter(SysfsWriter& writer)
    : writer_(writer),
      mu_(std::make_shared<std::mutex>()),
      blocked_(std::make_shared<std::set<Key>>()) {}

int DeadlineWriter::Write(const std::string& path, const std::string& value,
                          std::chrono::milliseconds timeout) {
  const Key key{path, value};
  {
    std::lock_guard<std::mutex> lock(*mu_);
    if (blocked_->count(key) != 0) return EINPROGRESS;
  }
  auto state = std::make_shared<InFlight>();
  std::thread([state, &writer = writer_, key, mu = mu_, blocked = blocked_] {
    const int result = writer.Write(key.first, key.second);
    {
      std::lock_guard<std::mutex> lock(state->mu);
      state->done = true;
      state->result = result;
    }
    state->done_cv.notify_all();
    std::lock_guard<std::mutex> lock(*mu);
    blocked->erase(key);
  }).detach();

  std::unique_lock<std::mutex> lock(state->mu);
  if (state->done_cv.wait_for(lock, timeout, [&] { return state->done; })) return state->result;
  lock.unlock();
  // Mark the write blocked unless it finished in the meantime. The writing thread never holds
  // both locks at once, so taking the registry and then the state lock cannot deadlock.
  std::lock_guard<std::mutex> registry(*mu_);
  std::lock_guard<std::mutex> relock(state->mu);
  if (state->done) return state->result;
  blocked_->insert(key);
  return ETIMEDOUT;
}

bool DeadlineWriter::Blocked(const std::string& path, const std::string& value) const {
  std::lock_guard<std::mutex> lock(*mu_);
  return blocked_->count({path, value}) != 0;
}

}  // namespace vfio_dra::vfio
