// DeadSockets: removes the sockets that earlier instances of this driver left behind when they
// died without a stop (SIGKILL, OOM, a pod deleted while its container was not running). Each
// plugin pod names its sockets by its UID (SocketLayout), so a new pod does not reuse a dead
// pod's names, and the kubelet's plugin watcher keeps a registration socket registered, retrying
// it with a growing backoff, for as long as the file exists; the kubelet's DRA manager also keeps
// dialing the dead pod's DRA socket for its health stream. Seen on the real node under the soak:
// four dead registration sockets at once, each retried by the kubelet. Invariants: only this
// driver's socket names are considered (`<driver>[-<uid>]-reg.sock` in the registrar directory,
// `dra[-<uid>].sock` beside our own DRA socket), never our own; a socket is removed only when a
// connect to it is refused (nothing listens: its process is gone) and it was bound at least
// `min_age` ago, because a live instance is refused too in the instant between its bind and its
// listen; anything else (a live socket, a file that is not a socket) is left alone.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "plugin/plugin_server.h"

namespace vfio_dra::plugin {

struct DeadSocketSweep {
  std::vector<std::string> removed;
  // Sockets that could not be inspected or removed: what, and why. The plugin starts anyway.
  std::vector<std::string> problems;
};

// `now` is the wall clock the sockets' change times are compared with (tests move it).
DeadSocketSweep RemoveDeadSockets(const SocketLayout& own, const std::string& driver_name,
                                  std::chrono::system_clock::time_point now,
                                  std::chrono::seconds min_age = std::chrono::seconds(30));

}  // namespace vfio_dra::plugin
