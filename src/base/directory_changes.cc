#include "base/directory_changes.h"

#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "base/file_io.h"

namespace vfio_dra {
namespace {

// What makes an entry appear, go, or hold new content once written: creation, a rename in or
// out, removal, and the close of a write. Not each write() (a reader waits for the close rather
// than read a file half written) nor attribute changes (no new content): a watched directory's
// writers pay for every event queued.
constexpr uint32_t kEntryEvents =
    IN_CREATE | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE;
// The directory itself going away or elsewhere: the path no longer names what is watched.
constexpr uint32_t kSelfEvents = IN_DELETE_SELF | IN_MOVE_SELF;

}  // namespace

DirectoryChanges::DirectoryChanges(std::string directory) : directory_(std::move(directory)) {
  fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd_ < 0) {
    unwatched_ = "cannot watch " + directory_ + " for changes (inotify_init1: " + ErrnoText(errno) +
                 "); every read lists the whole directory. Raise fs.inotify.max_user_instances "
                 "if the node has run out of inotify instances";
    return;
  }
  Watch();
}

DirectoryChanges::~DirectoryChanges() {
  if (fd_ >= 0) ::close(fd_);
}

void DirectoryChanges::Watch() {
  // Watched through a descriptor, so the watch and the identity Take compares are of the same
  // directory even if the path names another one by now.
  const int dir_fd = ::open(directory_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    unwatched_ = "cannot watch " + directory_ + " for changes (open: " + ErrnoText(errno) +
                 "); every read lists the whole directory until it can";
    return;
  }
  struct stat st {};
  const bool identified = ::fstat(dir_fd, &st) == 0;
  wd_ = ::inotify_add_watch(fd_, ("/proc/self/fd/" + std::to_string(dir_fd)).c_str(),
                            kEntryEvents | kSelfEvents | IN_ONLYDIR);
  if (wd_ < 0 && errno == ENOENT) {  // no /proc: by path, in the same instant
    wd_ = ::inotify_add_watch(fd_, directory_.c_str(), kEntryEvents | kSelfEvents | IN_ONLYDIR);
  }
  const int err = errno;
  ::close(dir_fd);
  if (wd_ < 0 || !identified) {
    if (wd_ >= 0) ::inotify_rm_watch(fd_, wd_);
    wd_ = -1;
    unwatched_ = "cannot watch " + directory_ +
                 " for changes (inotify_add_watch: " + ErrnoText(err) +
                 "); every read lists the whole directory until it can";
    return;
  }
  watched_device_ = st.st_dev;
  watched_inode_ = st.st_ino;
  unwatched_.reset();
}

DirectoryChanges::Batch DirectoryChanges::Take() {
  Batch batch;
  batch.everything = first_ || wd_ < 0;
  first_ = false;
  if (fd_ < 0) return batch;
  // The directory the path names now may not be the one watched (it, or a directory above it,
  // was renamed or replaced, or something was mounted over it): no event says so.
  struct stat st {};
  if (wd_ >= 0 && (::stat(directory_.c_str(), &st) != 0 || st.st_dev != watched_device_ ||
                   st.st_ino != watched_inode_)) {
    batch.everything = true;
    ::inotify_rm_watch(fd_, wd_);
    wd_ = -1;
  }
  // Large enough for one event with the longest name; a read returns whole events only.
  alignas(inotify_event) char buffer[sizeof(inotify_event) + NAME_MAX + 1 + 3072];
  for (;;) {
    const ssize_t n = ::read(fd_, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    if (n <= 0) {
      batch.everything = true;
      break;
    }
    for (ssize_t at = 0; at < n;) {
      const auto* event = reinterpret_cast<const inotify_event*>(buffer + at);
      at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      if ((event->mask & IN_Q_OVERFLOW) != 0) {
        batch.everything = true;
      } else if (event->wd != wd_) {
        // A watch given up below (its IN_IGNORED), or one the kernel already ended.
      } else if ((event->mask & (kSelfEvents | IN_IGNORED)) != 0) {
        batch.everything = true;
        if ((event->mask & IN_IGNORED) == 0) ::inotify_rm_watch(fd_, wd_);
        wd_ = -1;
      } else if (event->len > 0 && !batch.everything) {
        batch.names.insert(event->name);
      }
    }
  }
  // Before the caller reads the directory: what changes from here on is in the next Take.
  if (wd_ < 0) Watch();
  if (batch.everything) batch.names.clear();
  return batch;
}

}  // namespace vfio_dra
