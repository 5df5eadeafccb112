#include "cmd/malloc_tuning.h"

#include <gtest/gtest.h>

namespace vfio_dra::cmd {
namespace {

const std::string kOurs = "glibc.malloc.tcache_count=" + std::to_string(kMallocThreadCacheCount);

TEST(MallocTuning, AddsTheThreadCacheDepthWhenNothingIsSet) {
  EXPECT_EQ(TunablesWithMallocCache(nullptr), kOurs);
  EXPECT_EQ(TunablesWithMallocCache(""), kOurs);
}

TEST(MallocTuning, KeepsTheOperatorsOtherTunables) {
  EXPECT_EQ(TunablesWithMallocCache("glibc.malloc.arena_max=2"),
            "glibc.malloc.arena_max=2:" + kOurs);
}

TEST(MallocTuning, NeverOverridesTheOperatorsCacheDepth) {
  EXPECT_EQ(TunablesWithMallocCache("glibc.malloc.tcache_count=7"), std::nullopt);
  EXPECT_EQ(TunablesWithMallocCache("glibc.malloc.arena_max=1:glibc.malloc.tcache_count=0"),
            std::nullopt);
}

}  // namespace
}  // namespace vfio_dra::cmd
