// DaemonProcess: runs the real vfio-dra-plugin binary as a child process for integration tests,
// with its output captured to a file, and waits for its exit through a pidfd (no polling sleeps).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace vfio_dra::testing {

class DaemonProcess {
 public:
  DaemonProcess(std::vector<std::string> args, std::string log_path,
                std::vector<std::string> extra_env = {});
  ~DaemonProcess();  // SIGKILLs a child that is still running
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  bool Signal(int signal);
  // Returns the exit code (or 128+signal) once the child exits, or nullopt on timeout.
  std::optional<int> WaitForExit(std::chrono::milliseconds timeout);
  std::string Log() const;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int pidfd_ = -1;
  std::optional<int> exit_code_;
  std::string log_path_;
};

// `binary serve` for node "node1" with the given kubeconfig, registration and data directories,
// and the CDI directory, sysfs and /dev of a simulated node under `node_dir` (<node_dir>/cdi,
// /sys, /dev): the part of the command line every integration test's daemon shares.
std::vector<std::string> ServeCommand(const std::string& binary, const std::string& kubeconfig,
                                      const std::string& registrar_dir,
                                      const std::string& plugin_data_dir,
                                      const std::string& node_dir);

// Runs the binary to completion (for CLI tests) and returns its exit code and combined output.
struct CommandResult {
  int exit_code = -1;
  std::string output;
};
CommandResult RunCommand(const std::vector<std::string>& args, std::chrono::milliseconds timeout);

}  // namespace vfio_dra::testing
