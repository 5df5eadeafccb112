#include "step_pause.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>

namespace vfio_dra::testing {
namespace {

[[noreturn]] void Abort(const std::string& what) {
  std::fprintf(stderr, "step pause: %s: %s\n", what.c_str(), std::strerror(errno));
  std::abort();
}

// What one daemon pauses at, and which of those it has paused at already.
struct PauseState {
  std::string dir;
  std::mutex mu;
  std::set<std::string> pending;
};

void Pause(PauseState& state, const std::string& step) {
  {
    std::lock_guard<std::mutex> lock(state.mu);
    if (state.pending.erase(step) == 0) return;
  }
  // Open for reading before the pause is announced: the test may write as soon as it reads it.
  const std::string resume = state.dir + "/resume";
  const int in = ::open(resume.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (in < 0) Abort("cannot open " + resume);
  const std::string paused = state.dir + "/paused";
  const int out = ::open(paused.c_str(), O_WRONLY | O_CLOEXEC);
  if (out < 0) Abort("cannot open " + paused);
  const std::string line = step + "\n";
  if (::write(out, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    Abort("cannot write to " + paused);
  }
  ::close(out);
  pollfd fd{in, POLLIN, 0};
  while (::poll(&fd, 1, -1) < 0) {
    if (errno != EINTR) Abort("cannot wait on " + resume);
  }
  char buffer[64];
  while (::read(in, buffer, sizeof buffer) < 0 && errno == EINTR) {
  }
  ::close(in);
}

}  // namespace

std::function<void(const std::string&)> MakeStepPause(const std::string& steps,
                                                      const std::string& dir) {
  if (steps.empty()) return [](const std::string&) {};
  auto state = std::make_shared<PauseState>();
  state->dir = dir;
  std::stringstream list(steps);
  for (std::string step; std::getline(list, step, ',');) {
    if (!step.empty()) state->pending.insert(step);
  }
  return [state](const std::string& step) { Pause(*state, step); };
}

std::function<void(const std::string&)> StepPauseFromEnvironment() {
  const auto env = [](const char* name) {
    const char* value = std::getenv(name);
    return std::string(value == nullptr ? "" : value);
  };
  return MakeStepPause(env("VFIO_DRA_TEST_PAUSE_AT"), env("VFIO_DRA_TEST_PAUSE_DIR"));
}

std::string AwaitPause(int paused_fd, int seconds) {
  std::string line;
  for (;;) {
    pollfd fd{paused_fd, POLLIN, 0};
    const int ready = ::poll(&fd, 1, seconds * 1000);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return "";
    char c = 0;
    // The writer sends the whole line in one write (less than PIPE_BUF: never split).
    while (::read(paused_fd, &c, 1) == 1) {
      if (c == '\n') return line;
      line += c;
    }
    return line;
  }
}

bool ResumePaused(const std::string& dir) {
  const std::string resume = dir + "/resume";
  const int out = ::open(resume.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (out < 0) return false;  // ENXIO: nobody is paused
  const bool written = ::write(out, "go\n", 3) == 3;
  ::close(out);
  return written;
}

}  // namespace vfio_dra::testing
