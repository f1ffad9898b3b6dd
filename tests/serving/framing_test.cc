#include "serving/workers/framing.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include "worker.pb.h"

namespace numaserve::server {
namespace {

TEST(FramingTest, RoundTripsMessagesInOrder) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  for (uint64_t id = 1; id <= 3; ++id) {
    worker::Command c;
    c.set_id(id);
    c.mutable_run()->set_key("m:1");
    c.mutable_run()->set_batch(static_cast<int64_t>(id * 10));
    ASSERT_TRUE(WriteFramed(fds[0], c).ok());
  }
  for (uint64_t id = 1; id <= 3; ++id) {
    worker::Command c;
    ASSERT_TRUE(ReadFramed(fds[1], &c).ok());
    EXPECT_EQ(c.id(), id);
    EXPECT_EQ(c.run().batch(), static_cast<int64_t>(id * 10));
  }
  close(fds[0]);
  worker::Command c;
  absl::Status s = ReadFramed(fds[1], &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  close(fds[1]);
}

TEST(FramingTest, RejectsGarbageWithoutCrashing) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  const unsigned char huge[4] = {0xff, 0xff, 0xff, 0x7f};  // a 2 GiB frame
  ASSERT_EQ(write(fds[0], huge, 4), 4);
  worker::Command c;
  EXPECT_EQ(ReadFramed(fds[1], &c).code(), absl::StatusCode::kDataLoss);
  close(fds[0]);
  close(fds[1]);
}

}  // namespace
}  // namespace numaserve::server
