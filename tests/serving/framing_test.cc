#include "serving/workers/framing.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

#include "google/protobuf/io/zero_copy_stream_impl.h"
#include "google/protobuf/util/delimited_message_util.h"
#include "worker.pb.h"

namespace numaserve::serving {
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
  const unsigned char huge[5] = {0xff, 0xff, 0xff, 0xff, 0x07};  // a 2 GiB frame
  ASSERT_EQ(write(fds[0], huge, sizeof(huge)), static_cast<ssize_t>(sizeof(huge)));
  worker::Command c;
  absl::Status s = ReadFramed(fds[1], &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("control frame of"), absl::string_view::npos) << s;
  close(fds[0]);
  close(fds[1]);
}

// Peak resident set of this process, bytes.
int64_t PeakResidentBytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

// A length prefix claiming 60 MiB (within the 64 MiB limit) followed by
// three bytes: what is read is allocated as it arrives, not the 60 MiB the
// prefix claims. Before, the whole frame was allocated (and zeroed) first.
TEST(FramingTest, AClaimedLengthAllocatesOnlyWhatArrives) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  const unsigned char claim[7] = {0x80, 0x80, 0x80, 0x1e, 'a', 'b', 'c'};  // 30 << 21 = 60 MiB
  ASSERT_EQ(write(fds[0], claim, sizeof(claim)), static_cast<ssize_t>(sizeof(claim)));
  close(fds[0]);
  const int64_t before = PeakResidentBytes();
  worker::Command c;
  absl::Status s = ReadFramed(fds[1], &c);
  const int64_t growth = PeakResidentBytes() - before;
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(growth, int64_t{16} << 20) << "the peak resident set grew by " << growth << " bytes";
  close(fds[1]);
}

TEST(FramingTest, RejectsOverlongLengthVarint) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  // Six bytes that all say "more follows": no 32-bit length is that long.
  const unsigned char overlong[6] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80};
  ASSERT_EQ(write(fds[0], overlong, sizeof(overlong)), static_cast<ssize_t>(sizeof(overlong)));
  worker::Command c;
  absl::Status s = ReadFramed(fds[1], &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  close(fds[0]);
  close(fds[1]);
}

TEST(FramingTest, RejectsLengthVarintOver32Bits) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  const unsigned char wide[5] = {0x80, 0x80, 0x80, 0x80, 0x10};  // 2^32
  ASSERT_EQ(write(fds[0], wide, sizeof(wide)), static_cast<ssize_t>(sizeof(wide)));
  worker::Command c;
  absl::Status s = ReadFramed(fds[1], &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  close(fds[0]);
  close(fds[1]);
}

// The frames are protobuf's delimited format, so protobuf's own utilities
// read what WriteFramed writes and write what ReadFramed reads.
TEST(FramingTest, InteroperatesWithProtobufDelimitedUtilities) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  for (uint64_t id = 1; id <= 2; ++id) {
    worker::Command c;
    c.set_id(id);
    c.mutable_run()->set_key("m:1");
    c.mutable_run()->set_batch(static_cast<int64_t>(id * 10));
    ASSERT_TRUE(WriteFramed(fds[0], c).ok());
  }
  {
    // One buffered stream for both messages: it may read past the first.
    google::protobuf::io::FileInputStream input(fds[1]);
    for (uint64_t id = 1; id <= 2; ++id) {
      worker::Command c;
      bool clean_eof = false;
      ASSERT_TRUE(google::protobuf::util::ParseDelimitedFromZeroCopyStream(&c, &input, &clean_eof));
      EXPECT_EQ(c.id(), id);
      EXPECT_EQ(c.run().key(), "m:1");
      EXPECT_EQ(c.run().batch(), static_cast<int64_t>(id * 10));
    }
  }

  for (uint64_t id = 3; id <= 4; ++id) {
    worker::Command c;
    c.set_id(id);
    c.mutable_run()->set_key("m:2");
    ASSERT_TRUE(google::protobuf::util::SerializeDelimitedToFileDescriptor(c, fds[1]));
  }
  for (uint64_t id = 3; id <= 4; ++id) {
    worker::Command c;
    ASSERT_TRUE(ReadFramed(fds[0], &c).ok());
    EXPECT_EQ(c.id(), id);
    EXPECT_EQ(c.run().key(), "m:2");
  }
  close(fds[0]);
  close(fds[1]);
}

}  // namespace
}  // namespace numaserve::serving
