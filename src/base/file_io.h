// Small, checked file-system primitives shared by every module that persists state: whole-file
// reads with a size cap, and atomic replacement (temp file in the same directory, fsync, rename,
// fsync of the directory) so that readers only ever see a complete old or new file.
#pragma once

#include <sys/types.h>

#include <string>

#include "base/result.h"

namespace vfio_dra {

// Reads a whole file; refuses files larger than `max_bytes` so a bad path cannot exhaust memory.
Result<std::string> ReadFileToString(const std::string& path, size_t max_bytes = 16 << 20);

// Writes `contents` to `path` atomically with file mode `mode`; an error unless the new file and
// its directory entry are both on disk.
Status WriteFileAtomically(const std::string& path, const std::string& contents, mode_t mode);

// Creates `dir` and its parents if missing; an error (naming the directory) when that fails or
// `dir` exists and is not a directory.
Status EnsureDirectory(const std::string& dir);

// Makes the entries of `dir` durable (after a rename or unlink in it).
Status SyncDirectory(const std::string& dir);

// Describes errno as "<strerror> (errno N)".
std::string ErrnoText(int err);

}  // namespace vfio_dra
