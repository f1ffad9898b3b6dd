#include "base/child_fds.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

namespace numaserve::base {
namespace {

bool IsOpen(int fd) { return fcntl(fd, F_GETFD) >= 0; }

TEST(ChildFdsTest, DescriptorLimitCoversTheOpenFiles) {
  struct rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  const int bound = DescriptorLimit();
  EXPECT_GT(bound, 2);
  EXPECT_LE(bound, 1 << 20);
  if (limit.rlim_cur < (rlim_t{1} << 20)) {
    EXPECT_GE(static_cast<rlim_t>(bound), limit.rlim_cur);
  }
}

// A child keeps what lies below `first` and nothing from `first` up: files
// opened without close-on-exec, and high numbers, are closed.
TEST(ChildFdsTest, ClosesEveryDescriptorFromFirstUp) {
  int keep[2];
  ASSERT_EQ(pipe(keep), 0);  // not close-on-exec
  int drop[2];
  ASSERT_EQ(pipe(drop), 0);
  const int first = std::max(keep[0], keep[1]) + 1;
  ASSERT_LE(first, std::min(drop[0], drop[1]));
  const int high = 1000;
  ASSERT_EQ(dup2(drop[0], high), high);
  const int limit = DescriptorLimit();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    CloseDescriptorsFrom(first, limit);
    const bool kept = IsOpen(STDERR_FILENO) && IsOpen(keep[0]) && IsOpen(keep[1]);
    const bool dropped = !IsOpen(drop[0]) && !IsOpen(drop[1]) && !IsOpen(high);
    _exit(kept && dropped ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // The parent's are untouched.
  EXPECT_TRUE(IsOpen(drop[0]) && IsOpen(high));
  for (int fd : {keep[0], keep[1], drop[0], drop[1], high}) close(fd);
}

}  // namespace
}  // namespace numaserve::base
