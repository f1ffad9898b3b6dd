#include "serving/workers/shared_arena.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <set>

namespace numaserve::serving {
namespace {

TEST(SharedArenaTest, ChildProcessSeesParentWritesAndViceVersa) {
  auto arena = SharedArena::Create("test-arena", 1 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status();
  strcpy((*arena)->data(), "from parent");
  pid_t pid = fork();
  if (pid == 0) {
    // A second mapping of the same file, as a worker would make.
    auto attached = SharedArena::Attach(dup((*arena)->fd()), 1 << 20);
    if (!attached.ok() || strcmp((*attached)->data(), "from parent") != 0) _exit(1);
    strcpy((*attached)->data() + 4096, "from child");
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_STREQ((*arena)->data() + 4096, "from child");
}

TEST(ArenaAllocatorTest, AlignsAndRefusesWhenFull) {
  ArenaAllocator a(1024);
  auto x = a.Allocate(100);
  auto y = a.Allocate(1);
  ASSERT_TRUE(x && y);
  EXPECT_EQ(*x % 64, 0u);
  EXPECT_EQ(*y % 64, 0u);
  EXPECT_NE(*x, *y);
  EXPECT_FALSE(a.Allocate(1024).has_value());
  a.Free(*x);
  a.Free(*y);
  EXPECT_EQ(a.used(), 0u);
  EXPECT_TRUE(a.Allocate(1024).has_value());  // coalesced back into one range
}

TEST(ArenaAllocatorTest, RandomAllocationsNeverOverlapAndAllCoalesce) {
  ArenaAllocator a(1 << 16);
  std::mt19937 rng(7);
  std::map<uint64_t, size_t> live;
  for (int step = 0; step < 5000; ++step) {
    if (live.empty() || rng() % 2 == 0) {
      size_t bytes = 1 + rng() % 3000;
      if (auto off = a.Allocate(bytes)) {
        auto next = live.lower_bound(*off);
        if (next != live.end()) {
          ASSERT_LE(*off + bytes, next->first) << "overlap at step " << step;
        }
        if (next != live.begin()) {
          auto prev = std::prev(next);
          ASSERT_LE(prev->first + prev->second, *off) << "overlap at step " << step;
        }
        live[*off] = bytes;
      }
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      a.Free(it->first);
      live.erase(it);
    }
  }
  for (const auto& [off, bytes] : live) a.Free(off);
  EXPECT_EQ(a.used(), 0u);
  EXPECT_TRUE(a.Allocate(1 << 16).has_value());
}

TEST(ArenaBytesForBatches, GrowsWithTheBatchesInFlight) {
  const size_t two = size_t{256} << 20;
  EXPECT_EQ(ArenaBytesForBatches(two, 1), two);  // never smaller
  EXPECT_EQ(ArenaBytesForBatches(two, 2), two);
  EXPECT_EQ(ArenaBytesForBatches(two, 3), two / 2 * 3);  // two instances + one being copied
  EXPECT_EQ(ArenaBytesForBatches(two, 9), two / 2 * 9);
  EXPECT_EQ(ArenaBytesForBatches(4096 * 3, 3) % 4096, 0u);  // whole pages
  EXPECT_GE(ArenaBytesForBatches(4096 * 3, 3), size_t{4096} * 3 / 2 * 3);
}

}  // namespace
}  // namespace numaserve::serving
