// Worker framing (serving/workers/framing.h): the bytes of a control
// socket, read as the front end reads a worker's replies (worker::Reply)
// and as a worker reads the front end's commands (worker::Command):
// ReadFramed frame after frame until it reports an error, which must be
// end of stream (UNAVAILABLE) or a bad frame (DATA_LOSS), never a crash.
// Every message that decodes is written again (WriteFramed) and read back
// to the same message. Lengths are checked before anything is allocated:
// no allocation exceeds the 64 MiB frame limit (run_fuzzers.sh runs this
// target with -malloc_limit_mb=64), and a frame claiming that much while
// holding a few bytes is read into a buffer the size of what arrived
// (FramingTest.AClaimedLengthAllocatesOnlyWhatArrives measures it).
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "serving/workers/framing.h"
#include "tests/fuzz/fuzz_target.h"
#include "worker.pb.h"

namespace numaserve::fuzz {
namespace {

// Frames read from one input at most: each takes at least one byte, so
// this only stops an input of many empty frames early.
constexpr int kMaxFrames = 4096;
// Messages larger than this are not written back: the socket pair's buffer
// holds them without a reader (the default is over 200 KiB).
constexpr size_t kMaxRoundTripBytes = size_t{64} << 10;

// A connected socket pair, made once: what WriteFramed writes to `out`,
// ReadFramed reads from `in`.
struct SocketPair {
  int out = -1;
  int in = -1;
  SocketPair() {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) abort();
    out = fds[0];
    in = fds[1];
  }
};

const SocketPair& Pair() {
  static const SocketPair* pair = new SocketPair();
  return *pair;
}

// Writes `message` as a frame and reads it back: the same message.
template <typename Message>
void CheckRoundTrip(const Message& message) {
  if (message.ByteSizeLong() > kMaxRoundTripBytes) return;
  FUZZ_CHECK(serving::WriteFramed(Pair().out, message).ok());
  Message back;
  const absl::Status s = serving::ReadFramed(Pair().in, &back);
  FUZZ_CHECK(s.ok());
  FUZZ_CHECK(back.SerializeAsString() == message.SerializeAsString());
}

// Reads frames of `Message` from the file at `path` until an error,
// round-tripping each.
template <typename Message>
void ReadAll(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) abort();
  for (int i = 0; i < kMaxFrames; ++i) {
    Message message;
    const absl::Status s = serving::ReadFramed(fd, &message);
    if (!s.ok()) {
      FUZZ_CHECK(s.code() == absl::StatusCode::kUnavailable ||
                 s.code() == absl::StatusCode::kDataLoss);
      break;
    }
    CheckRoundTrip(message);
  }
  close(fd);
}

}  // namespace

int FuzzOne(const uint8_t* data, size_t size) {
  const std::string path = MemoryFile(0, AsText(data, size));
  ReadAll<worker::Command>(path);
  ReadAll<worker::Reply>(path);
  return 0;
}

}  // namespace numaserve::fuzz
