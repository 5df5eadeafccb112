// Moving an unusable checkpoint file (a corrupt record, a corrupt version-1 checkpoint) out of
// the way under a name of its own, and the problem text that says so for the log. The caller makes
// sure the file is the one it means to move (see PrepareCheckpoint's records lock).
#pragma once

#include <string>

#include "base/result.h"

namespace vfio_dra::prepare {

// Gives the file at `path` a name of its own beside it, "<path>.corrupt-<seconds>" (with "-2",
// "-3", ... when an earlier move in the same second took that name): link(2) never replaces a
// name, so a copy moved aside before is never overwritten. Returns the new name.
Result<std::string> MoveToUniqueAside(const std::string& path);

// The problem text for the log of an unusable record, moved aside (`moved`) or not.
std::string UnusableText(const std::string& path, const std::string& reason,
                         const Result<std::string>& moved, const std::string& consequence);

}  // namespace vfio_dra::prepare
