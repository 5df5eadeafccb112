// ElasticThreadPool: runs tasks on threads that are reused. A thread is started whenever more
// tasks wait than threads are idle, so a task that blocks (in the kernel, or for the length of a
// stream) never holds up another; a thread idle for the pool's idle lifetime ends, so an idle
// process keeps none. Reuse spares each short task a thread's creation and its first trip
// through malloc's arenas, which under a burst of calls cost more than most tasks.
// Invariants: tasks run in the order they were queued (by whichever thread is free); threads are
// detached and share the pool's state, so a task still running when the pool goes finishes on
// its own (whatever it uses must outlive it, as for any detached thread); queued tasks still run
// after the pool is gone; a task's captures are released before its thread waits for more work.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace vfio_dra {

class ElasticThreadPool {
 public:
  struct State;  // shared with the pool's threads

  // `thread_name` names every thread of the pool (see NameThisThread).
  ElasticThreadPool(std::string thread_name, std::chrono::milliseconds idle_lifetime);
  // Idle threads end at once; running tasks finish on their own.
  ~ElasticThreadPool();
  ElasticThreadPool(const ElasticThreadPool&) = delete;
  ElasticThreadPool& operator=(const ElasticThreadPool&) = delete;

  // Queues `task`, starting a thread for it when none is idle. Throws std::system_error when that
  // thread cannot be started; `task` is then not run.
  void Run(std::function<void()> task);

  // For tests and metrics: threads of the pool, and those of them waiting for work.
  size_t Threads() const;
  size_t Idle() const;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace vfio_dra
