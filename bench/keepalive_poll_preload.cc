// Loaded into prepare_bench with LD_PRELOAD (prepare_bench does it itself, see its header): the
// fake API server's kept-alive connections wait for their next request without waking every
// 10 ms. The packaged cpp-httplib (0.11) waits between two requests on a connection by polling
// it with a 10 ms timeout and sleeping 1 ms after each empty poll: about 180 wakeups a second
// for every idle connection, some 96 of them in this benchmark (the daemon's and the floor's),
// which took about a seventh of a core on this 2-core machine. An API server blocks until the
// next request arrives; so that the benchmark measures the daemon and the floor rather than
// the fake server's polling, this stretches exactly that poll (a one-descriptor poll with a
// 10 ms timeout, called from libcpp-httplib) to one second. A connection idle for longer than
// cpp-httplib's keep-alive timeout still closes, up to a second later. Never for a node.
#include <dlfcn.h>
#include <poll.h>

#include <cstring>

namespace {

using PollFunction = int (*)(struct pollfd*, nfds_t, int);

constexpr int kPackagedKeepAlivePollMs = 10;
constexpr int kStretchedKeepAlivePollMs = 1000;

bool CalledFromHttplib(void* return_address) {
  Dl_info info{};
  return dladdr(return_address, &info) != 0 && info.dli_fname != nullptr &&
         std::strstr(info.dli_fname, "libcpp-httplib") != nullptr;
}

}  // namespace

extern "C" {

// What prepare_bench looks up to know that this shim is loaded (a preload the loader cannot load
// is only warned about).
// NOLINTNEXTLINE(readability-identifier-naming,cppcoreguidelines-avoid-non-const-global-variables)
int vfio_dra_keepalive_poll_stretched = 1;

// NOLINTNEXTLINE(readability-identifier-naming): the libc name it wraps
int poll(struct pollfd* fds, nfds_t count, int timeout) {
  static const auto real = reinterpret_cast<PollFunction>(dlsym(RTLD_NEXT, "poll"));
  // The keep-alive wait is a read wait; httplib's 10 ms is used for nothing else today, but a
  // write or connect wait must never be stretched.
  if (count == 1 && timeout == kPackagedKeepAlivePollMs && fds[0].events == POLLIN &&
      CalledFromHttplib(__builtin_return_address(0))) {
    timeout = kStretchedKeepAlivePollMs;
  }
  return real(fds, count, timeout);
}

}  // extern "C"
