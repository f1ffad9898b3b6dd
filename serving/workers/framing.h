// Protobuf messages over a stream socket (the worker control channel), in
// protobuf's own delimited format: the message's length as a varint, then the
// serialized message (what google/protobuf/util/delimited_message_util.h
// writes and parses). A frame is at most 64 MiB.
//
// Reads are unbuffered on purpose: protobuf's input streams read ahead, so a
// stream made for one message would swallow the start of the next. Each read
// takes the varint byte by byte (at most 5 bytes) and then exactly the
// message, so callers need no state per descriptor.
#pragma once

#include "absl/status/status.h"
#include "google/protobuf/message_lite.h"

namespace numaserve::serving {

// Writes one message; retries on EINTR and short writes.
absl::Status WriteFramed(int fd, const google::protobuf::MessageLite& message);
// Reads one message. UNAVAILABLE("peer closed") on end of stream;
// DATA_LOSS for a length over 64 MiB or not a varint, or bytes that do not
// parse. The buffer grows as the frame's bytes arrive (1 MiB at a time), so
// what it allocates is bounded by what the peer sent, not by the length it
// claims.
absl::Status ReadFramed(int fd, google::protobuf::MessageLite* message);

}  // namespace numaserve::serving
