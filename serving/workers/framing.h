// Length-prefixed protobuf messages over a stream socket (the worker control
// channel): 4 bytes little-endian length, then the serialized message.
#pragma once

#include "absl/status/status.h"
#include "google/protobuf/message_lite.h"

namespace numaserve::server {

// Writes one message; retries on EINTR and short writes.
absl::Status WriteFramed(int fd, const google::protobuf::MessageLite& message);
// Reads one message. UNAVAILABLE("peer closed") on end of stream.
absl::Status ReadFramed(int fd, google::protobuf::MessageLite* message);

}  // namespace numaserve::server
