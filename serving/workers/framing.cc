#include "serving/workers/framing.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_format.h"
#include "base/errno_text.h"

namespace numaserve::server {
namespace {

constexpr uint32_t kMaxFrame = 64u << 20;

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

}  // namespace

absl::Status WriteFramed(int fd, const google::protobuf::MessageLite& message) {
  std::string buffer(4, '\0');
  if (!message.AppendToString(&buffer)) return absl::InternalError("cannot serialize message");
  uint32_t n = static_cast<uint32_t>(buffer.size() - 4);
  for (int i = 0; i < 4; ++i) buffer[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return WriteAll(fd, buffer.data(), buffer.size());
}

absl::Status ReadFramed(int fd, google::protobuf::MessageLite* message) {
  unsigned char header[4];
  if (absl::Status s = ReadAll(fd, reinterpret_cast<char*>(header), 4); !s.ok()) return s;
  uint32_t n = header[0] | (header[1] << 8) | (header[2] << 16) | (uint32_t{header[3]} << 24);
  if (n > kMaxFrame) return absl::DataLossError(absl::StrFormat("control frame of %d bytes", n));
  std::string buffer(n, '\0');
  if (absl::Status s = ReadAll(fd, buffer.data(), n); !s.ok()) return s;
  if (!message->ParseFromString(buffer)) return absl::DataLossError("malformed control message");
  return absl::OkStatus();
}

}  // namespace numaserve::server
