// The test process's own threads with the names NameThisThread gave them, from /proc/self/task:
// tests check which threads a server keeps and read their CPU time.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace vfio_dra::testing {

struct OwnThread {
  std::string name;
  std::filesystem::path task_dir;  // /proc/self/task/<tid>
};

inline std::vector<OwnThread> OwnThreads() {
  std::vector<OwnThread> threads;
  std::error_code ec;  // a thread that ends while listed is skipped
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name)) threads.push_back({name, task.path()});
  }
  return threads;
}

inline int CountOwnThreadsNamed(const std::string& name) {
  int count = 0;
  for (const OwnThread& thread : OwnThreads()) count += thread.name == name ? 1 : 0;
  return count;
}

}  // namespace vfio_dra::testing
