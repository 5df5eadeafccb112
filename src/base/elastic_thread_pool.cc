#include "base/elastic_thread_pool.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "base/thread_name.h"

namespace vfio_dra {

struct ElasticThreadPool::State {
  State(std::string name, std::chrono::milliseconds lifetime)
      : thread_name(std::move(name)), idle_lifetime(lifetime) {}
  const std::string thread_name;
  const std::chrono::milliseconds idle_lifetime;
  mutable std::mutex mu;
  std::condition_variable work;
  std::deque<std::pair<uint64_t, std::function<void()>>> queued;  // with the number Run gave it
  uint64_t next_task = 0;
  size_t threads = 0;
  size_t idle = 0;
  bool closing = false;
};

namespace {

void Work(const std::shared_ptr<ElasticThreadPool::State>& state) {
  NameThisThread(state->thread_name.c_str());
  std::unique_lock<std::mutex> lock(state->mu);
  for (;;) {
    ++state->idle;
    state->work.wait_for(lock, state->idle_lifetime,
                         [&] { return !state->queued.empty() || state->closing; });
    --state->idle;
    if (state->queued.empty()) break;  // idle too long, or the pool is gone
    std::function<void()> task = std::move(state->queued.front().second);
    state->queued.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // what the task holds goes now, not when the thread next runs one
    lock.lock();
  }
  --state->threads;
}

}  // namespace

ElasticThreadPool::ElasticThreadPool(std::string thread_name,
                                     std::chrono::milliseconds idle_lifetime)
    : state_(std::make_shared<State>(std::move(thread_name), idle_lifetime)) {}

ElasticThreadPool::~ElasticThreadPool() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->closing = true;
  state_->work.notify_all();
}

void ElasticThreadPool::Run(std::function<void()> task) {
  uint64_t number = 0;
  bool start_thread = false;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    number = state_->next_task++;
    state_->queued.emplace_back(number, std::move(task));
    start_thread = state_->queued.size() > state_->idle;
    if (start_thread) ++state_->threads;
  }
  if (!start_thread) {
    // Outside the lock: a worker woken while it is held would only wake to block on it again
    // (two more context switches per task, and the submitter often preempted by the wakee).
    state_->work.notify_one();
    return;
  }
  try {
    std::thread(Work, state_).detach();
  } catch (const std::system_error&) {
    std::lock_guard<std::mutex> lock(state_->mu);
    --state_->threads;
    // Unless a thread that became idle meanwhile took it, the task is withdrawn: the caller is
    // told it will not run.
    for (auto it = state_->queued.begin(); it != state_->queued.end(); ++it) {
      if (it->first == number) {
        state_->queued.erase(it);
        throw;
      }
    }
  }
}

size_t ElasticThreadPool::Threads() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->threads;
}

size_t ElasticThreadPool::Idle() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->idle;
}

}  // namespace vfio_dra
