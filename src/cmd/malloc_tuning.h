// How `serve` sets up glibc's allocator for the daemon's shape of work: an idle process that
// should hold little, and bursts of kubelet calls whose handler threads allocate and free small
// objects (JSON trees, paths, strings) all at once.
// - One arena, for a small idle footprint.
// - A deeper per-thread cache. With one arena, every allocation or free that a thread's cache
//   cannot take locks the arena; glibc's cache holds 7 chunks of a size, so a JSON tree freed or a
//   record built spills into the lock at once, and 32 prepares at once spent a quarter of their
//   context switches waiting for it. glibc reads the cache depth (glibc.malloc.tcache_count) only
//   from GLIBC_TUNABLES at start-up, so serve re-executes itself once with it set.
// Invariants: an operator's own setting (MALLOC_ARENA_MAX, or arena_max or tcache_count in
// GLIBC_TUNABLES) is never overridden; the re-execution happens at most once, before any thread
// exists (the variable it sets is its own guard), with the same arguments, environment and PID;
// if it fails, the daemon runs on with glibc's defaults and says so.
#pragma once

#include <optional>
#include <string>

namespace vfio_dra::cmd {

// Chunks of each size a thread keeps for reuse (glibc's default is 7). Handler threads end when
// idle, returning what they kept; the threads that live on keep at most this many per size.
inline constexpr int kMallocThreadCacheCount = 64;

// What GLIBC_TUNABLES should be for `current` (nullptr: unset): nullopt when it needs no change
// (the operator chose a cache depth), else `current` with the cache depth added.
std::optional<std::string> TunablesWithMallocCache(const char* current);

// Sets up the allocator for `serve`, before any thread starts: re-executes this program
// (/proc/self/exe, same `argv`) with the deeper cache when GLIBC_TUNABLES lacks one, so normally
// it returns only in the re-executed process; then limits malloc to one arena, unless the operator
// set MALLOC_ARENA_MAX or glibc.malloc.arena_max. Returns why the cache could not be set, if so;
// the daemon runs on with glibc's default cache and says so.
std::optional<std::string> TuneMallocForServe(char** argv);

}  // namespace vfio_dra::cmd
