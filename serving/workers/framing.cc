#include "serving/workers/framing.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_format.h"
#include "base/errno_text.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/delimited_message_util.h"

namespace numaserve::serving {
namespace {

constexpr uint32_t kMaxFrame = 64u << 20;
// A frame is read into memory this much at a time, the buffer growing as
// its bytes arrive: a length prefix alone makes no allocation of the size
// it claims.
constexpr size_t kReadChunk = size_t{1} << 20;
// A varint carries 7 bits a byte, so a 32-bit length takes at most 5 bytes,
// and the fifth may use only its low 4 bits.
constexpr int kMaxLengthBytes = 5;
constexpr uint8_t kMaxLastLengthByte = 0x0f;

absl::Status WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(
          absl::StrFormat("control socket write: %s", base::ErrnoText(errno)));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(
          absl::StrFormat("control socket read: %s", base::ErrnoText(errno)));
    }
    if (r == 0) return absl::UnavailableError("peer closed the control socket");
    p += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

// Reads the varint length in front of a message one byte at a time, so that
// nothing past it leaves the socket, and decodes it with protobuf's reader.
absl::Status ReadLength(int fd, uint32_t* length) {
  uint8_t prefix[kMaxLengthBytes] = {};
  int count = 0;
  do {
    if (count == kMaxLengthBytes) {
      return absl::DataLossError(absl::StrFormat(
          "control frame length is a varint longer than %d bytes", kMaxLengthBytes));
    }
    if (absl::Status s = ReadAll(fd, reinterpret_cast<char*>(&prefix[count]), 1); !s.ok()) {
      return s;
    }
    ++count;
  } while ((prefix[count - 1] & 0x80) != 0);
  if (count == kMaxLengthBytes && prefix[count - 1] > kMaxLastLengthByte) {
    return absl::DataLossError("control frame length overflows 32 bits");
  }
  google::protobuf::io::CodedInputStream input(prefix, count);
  if (!input.ReadVarint32(length)) {
    return absl::DataLossError("control frame length is not a varint");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFramed(int fd, const google::protobuf::MessageLite& message) {
  std::string buffer;
  {
    // StringOutputStream may leave the string in any state while it lives;
    // the buffer is read only once the stream is gone.
    google::protobuf::io::StringOutputStream output(&buffer);
    if (!google::protobuf::util::SerializeDelimitedToZeroCopyStream(message, &output)) {
      return absl::InternalError("cannot serialize message");
    }
  }
  return WriteAll(fd, buffer.data(), buffer.size());
}

absl::Status ReadFramed(int fd, google::protobuf::MessageLite* message) {
  uint32_t n = 0;
  if (absl::Status s = ReadLength(fd, &n); !s.ok()) return s;
  if (n > kMaxFrame) return absl::DataLossError(absl::StrFormat("control frame of %d bytes", n));
  std::string buffer;
  while (buffer.size() < n) {
    const size_t have = buffer.size();
    const size_t chunk = std::min<size_t>(n - have, kReadChunk);
    buffer.resize(have + chunk);
    if (absl::Status s = ReadAll(fd, buffer.data() + have, chunk); !s.ok()) return s;
  }
  if (!message->ParseFromString(buffer)) return absl::DataLossError("malformed control message");
  return absl::OkStatus();
}

}  // namespace numaserve::serving
