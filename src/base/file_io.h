// Small, checked file-system primitives shared by every module that persists state: whole-file
// reads with a size cap, and atomic replacement (temp file in the same directory, fsync, rename,
// fsync of the directory, each fsync only where the file needs it) so that readers only ever see a
// complete old or new file.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"

namespace vfio_dra {

// Reads a whole file; refuses files larger than `max_bytes` so a bad path cannot exhaust memory.
Result<std::string> ReadFileToString(const std::string& path, size_t max_bytes = 16 << 20);
// The same for a file the caller has open (from its current offset; `path` names it in errors),
// so that what is read is the very file the caller stat'ed. The caller closes `fd`.
Result<std::string> ReadOpenFileToString(int fd, const std::string& path, size_t max_bytes);

// How far an atomic replacement is made durable before it returns. Readers always see a complete
// old or new file; what differs is what survives a power loss (a process crash loses nothing
// written, as the page cache outlives the process).
enum class Durability {
  // The file and its directory entry are on disk.
  kDurable,
  // The file's data is on disk, its directory entry is not yet: the caller makes the directory
  // durable (GroupDirectorySync, so that writers finishing together share one directory fsync).
  kDataOnly,
  // Nothing is forced to disk: for files on tmpfs, or that a reboot makes useless anyway.
  kVolatile,
};

// The fsync(2) calls a durable write runs, replaceable so that tests can count them: `file` of an
// open file (`path` names it in errors), `directory` of a directory's entries. An unset member
// runs fsync(2).
struct DiskSync {
  std::function<Status(int fd, const std::string& path)> file;
  std::function<Status(const std::string& directory)> directory;
  Status File(int fd, const std::string& path) const;
  Status Directory(const std::string& directory) const;
};

// Writes `contents` to `path` atomically with file mode `mode`, made durable as `durability` says
// (through `sync`); an error (naming the file) when any step fails.
Status WriteFileAtomically(const std::string& path, const std::string& contents, mode_t mode,
                           Durability durability = Durability::kDurable, const DiskSync& sync = {});

// The prefix of the temporary files WriteFileAtomically makes for `file_name` in its directory.
std::string TemporaryFilePrefix(const std::string& file_name);
// The file a directory entry is a temporary file of (".<name>.tmp-<n>" -> "<name>"); none for an
// entry that is not one.
std::optional<std::string_view> TemporaryFileStandsFor(std::string_view entry);

// A file's path as its directory and its name: "a/b.json" -> {"a", "b.json"}, "b.json" ->
// {".", "b.json"}, "/b.json" -> {"/", "b.json"}.
std::pair<std::string, std::string> SplitFilePath(const std::string& path);

// Removes `path` (gone already is fine) and the temporary files that writes of it left behind
// when their process died between creating and renaming them. Only call while no write of `path`
// can be running (the caller holds whatever orders those writes).
Status RemoveFileAndTemporaries(const std::string& path);
// Files a caller cannot name one by one (a claim's metadata specs, one per request): a name that
// begins with `prefix` and ends with `suffix`. The prefix must not be empty.
struct FileNamePattern {
  std::string prefix;
  std::string suffix;
  bool Matches(std::string_view name) const {
    return name.size() >= prefix.size() + suffix.size() && name.starts_with(prefix) &&
           name.ends_with(suffix);
  }
};
// The same for several files of one directory, with one listing of it: those in `names`, and
// the regular files (and leftover temporary files) that match one of `patterns`.
Status RemoveFilesAndTemporaries(const std::string& dir, const std::vector<std::string>& names,
                                 const std::vector<FileNamePattern>& patterns = {});

// Creates `dir` and its parents if missing; an error (naming the directory) when that fails or
// `dir` exists and is not a directory.
Status EnsureDirectory(const std::string& dir);

// Makes the entries of `dir` durable (after a rename or unlink in it).
Status SyncDirectory(const std::string& dir);

// Describes errno as "<strerror> (errno N)".
std::string ErrnoText(int err);

}  // namespace vfio_dra
