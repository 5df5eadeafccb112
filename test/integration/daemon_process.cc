#include "integration/daemon_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace vfio_dra::testing {

DaemonProcess::DaemonProcess(std::vector<std::string> args, std::string log_path,
                             std::vector<std::string> extra_env)
    : log_path_(std::move(log_path)) {
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  // A variable of `extra_env` replaces the inherited one: with two entries of one name, getenv
  // reads the first and the dynamic loader the last.
  const auto overridden = [&](const char* entry) {
    return std::any_of(extra_env.begin(), extra_env.end(), [&](const std::string& e) {
      const size_t name_end = e.find('=');
      return name_end != std::string::npos && std::strncmp(entry, e.c_str(), name_end + 1) == 0;
    });
  };
  for (char** e = environ; *e != nullptr; ++e) {
    // Isolate the child from the developer's cluster settings.
    if (std::strncmp(*e, "KUBECONFIG=", 11) == 0 || std::strncmp(*e, "NODE_NAME=", 10) == 0 ||
        std::strncmp(*e, "KUBERNETES_SERVICE_", 19) == 0 || std::strncmp(*e, "POD_UID=", 8) == 0 ||
        overridden(*e)) {
      continue;
    }
    env_strings.emplace_back(*e);
  }
  for (auto& e : extra_env) env_strings.push_back(e);
  std::vector<char*> envp;
  envp.reserve(env_strings.size() + 1);
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  pid_ = fork();
  if (pid_ == 0) {
    int fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    // The test runner may block signals; the daemon must start with the default mask.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
}

DaemonProcess::~DaemonProcess() {
  if (!exit_code_.has_value() && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    WaitForExit(std::chrono::seconds(10));
  }
  if (pidfd_ >= 0) ::close(pidfd_);
}

bool DaemonProcess::Signal(int signal) { return pid_ > 0 && ::kill(pid_, signal) == 0; }

std::optional<int> DaemonProcess::WaitForExit(std::chrono::milliseconds timeout) {
  if (exit_code_.has_value()) return exit_code_;
  pollfd p{pidfd_, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return std::nullopt;
  int status = 0;
  if (::waitpid(pid_, &status, 0) != pid_) return std::nullopt;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return exit_code_;
}

std::string DaemonProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

CommandResult RunCommand(const std::vector<std::string>& args, std::chrono::milliseconds timeout) {
  char tmpl[] = "/tmp/vfio-dra-cmd-XXXXXX";
  const int fd = mkstemp(tmpl);
  ::close(fd);
  CommandResult result;
  {
    DaemonProcess process(args, tmpl);
    auto code = process.WaitForExit(timeout);
    result.exit_code = code.value_or(-1);
    result.output = process.Log();
  }
  ::unlink(tmpl);
  return result;
}

std::vector<std::string> ServeCommand(const std::string& binary, const std::string& kubeconfig,
                                      const std::string& registrar_dir,
                                      const std::string& plugin_data_dir,
                                      const std::string& node_dir) {
  return {binary,
          "serve",
          "--node-name",
          "node1",
          "--kubeconfig",
          kubeconfig,
          "--registrar-dir",
          registrar_dir,
          "--plugin-data-dir",
          plugin_data_dir,
          "--cdi-dir",
          node_dir + "/cdi",
          "--sysfs-root",
          node_dir + "/sys",
          "--dev-root",
          node_dir + "/dev"};
}

}  // namespace vfio_dra::testing
