// A diagnostic for prepare_bench --daemon-fsync off, loaded into the benchmark's daemon with
// LD_PRELOAD: fsync and fdatasync return at once without writing anything. It answers one
// question, how much of the prepare figure is the wait for (and the CPU of) durability, by taking
// durability away from the daemon alone; the floor beside it keeps its fsyncs. Never for a node.
#include <unistd.h>

extern "C" {

// NOLINTNEXTLINE(readability-identifier-naming): the libc names it replaces
int fsync(int /*fd*/) { return 0; }

// NOLINTNEXTLINE(readability-identifier-naming)
int fdatasync(int /*fd*/) { return 0; }

}  // extern "C"
