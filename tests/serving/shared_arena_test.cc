#include "serving/workers/shared_arena.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"

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

// An arena reaches a child only when handed to it (the supervisor places
// each worker's own at kWorkerArenaFd): the file is close-on-exec, so a
// worker or a training job started later inherits no other worker's arena.
// Its size is sealed: the worker it is shared with cannot shrink it under
// the server's mapping.
TEST(SharedArenaTest, IsCloseOnExecAndSealedAtItsSize) {
  auto arena = SharedArena::Create("test-arena", 1 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status();
  const int fd = (*arena)->fd();
  EXPECT_NE(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  const int seals = fcntl(fd, F_GET_SEALS);
  ASSERT_GE(seals, 0) << strerror(errno);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  // Another process's descriptor of the same file is refused alike.
  const int other = open(absl::StrCat("/proc/self/fd/", fd).c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(other, 0) << strerror(errno);
  EXPECT_NE(ftruncate(other, 0), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(other, 2 << 20), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(fcntl(other, F_ADD_SEALS, 0), 0);
  close(other);
  struct stat st{};
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_size, 1 << 20);
  (*arena)->data()[(1 << 20) - 1] = 7;  // the whole mapping still backed
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
