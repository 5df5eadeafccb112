#include "sysfs/sysfs_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace vfio_dra::sysfs {

int KernelSysfsWriter::Write(const std::string& path, std::string_view value) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  ssize_t written = 0;
  do {
    written = ::write(fd, value.data(), value.size());
  } while (written < 0 && errno == EINTR);
  const int write_error = written < 0 ? errno : 0;
  // Some store handlers report their result only at close.
  const int close_error = ::close(fd) != 0 ? errno : 0;
  if (write_error != 0) return write_error;
  if (static_cast<size_t>(written) != value.size()) return EIO;
  return close_error;
}

int KernelSysfsWriter::ProbeWritable(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  ::close(fd);
  return 0;
}

}  // namespace vfio_dra::sysfs
