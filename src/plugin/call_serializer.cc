#include "plugin/call_serializer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include "base/file_io.h"

namespace vfio_dra::plugin {

Result<std::unique_ptr<CallSerializer>> CallSerializer::Open(const std::string& lock_file) {
  int fd = ::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return MakeError(ErrorKind::kUnavailable,
                     "cannot open lock file " + lock_file + ": " + ErrnoText(errno));
  }
  return std::unique_ptr<CallSerializer>(new CallSerializer(fd));
}

CallSerializer::~CallSerializer() { ::close(fd_); }

CallSerializer::Guard::Guard(CallSerializer& owner) : owner_(owner), lock_(owner.mu_) {
  // flock is per open file description: the mutex orders threads here, the flock orders us
  // against the other instance. EINTR is the only failure that can happen on a valid fd.
  while (::flock(owner_.fd_, LOCK_EX) != 0 && errno == EINTR) {
  }
}

CallSerializer::Guard::~Guard() { ::flock(owner_.fd_, LOCK_UN); }

}  // namespace vfio_dra::plugin
