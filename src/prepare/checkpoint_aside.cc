// See checkpoint_aside.h.
#include "prepare/checkpoint_aside.h"

#include <unistd.h>

#include <cerrno>
#include <ctime>

#include "base/file_io.h"

namespace vfio_dra::prepare {

Result<std::string> MoveToUniqueAside(const std::string& path) {
  const std::string base = path + ".corrupt-" + std::to_string(std::time(nullptr));
  constexpr int kMaxNames = 1000;
  for (int n = 1; n <= kMaxNames; ++n) {
    const std::string aside = n == 1 ? base : base + "-" + std::to_string(n);
    if (::link(path.c_str(), aside.c_str()) != 0) {
      if (errno == EEXIST) continue;
      return MakeError(ErrorKind::kUnavailable,
                       "cannot link it to " + aside + ": " + ErrnoText(errno));
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return MakeError(ErrorKind::kUnavailable,
                       "linked it to " + aside + " but cannot unlink it: " + ErrnoText(errno));
    }
    return aside;
  }
  return MakeError(ErrorKind::kUnavailable,
                   "every name " + base + "[-N] up to " + std::to_string(kMaxNames) + " is taken");
}

std::string UnusableText(const std::string& path, const std::string& reason,
                         const Result<std::string>& moved, const std::string& consequence) {
  if (!moved.ok()) {
    return "the prepare checkpoint record " + path + " is unusable (" + reason +
           ") and cannot be moved aside: " + moved.error().message + "; " + consequence;
  }
  return "the prepare checkpoint record " + path + " is unusable (" + reason + "); moved it to " +
         *moved + "; " + consequence;
}

}  // namespace vfio_dra::prepare
