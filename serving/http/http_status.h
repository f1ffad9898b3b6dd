// The HTTP status of every absl::StatusCode, in one table: how the HTTP/REST
// front end answers what the service's calls return. The mapping is
// google.rpc.Code's (google/rpc/code.proto, what gRPC-to-HTTP gateways
// use), so RESOURCE_EXHAUSTED (back-pressure: a full queue, the in-flight
// byte budget) is 429 Too Many Requests and UNAVAILABLE (not ready,
// draining) is 503.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace numaserve::serving::http {

struct HttpStatus {
  int code = 200;
  const char* reason = "OK";  // the reason phrase of the status line
};

// OK 200, CANCELLED 499, UNKNOWN 500, INVALID_ARGUMENT 400,
// DEADLINE_EXCEEDED 504, NOT_FOUND 404, ALREADY_EXISTS 409,
// PERMISSION_DENIED 403, RESOURCE_EXHAUSTED 429, FAILED_PRECONDITION 400,
// ABORTED 409, OUT_OF_RANGE 400, UNIMPLEMENTED 501, INTERNAL 500,
// UNAVAILABLE 503, DATA_LOSS 500, UNAUTHENTICATED 401; any other value 500.
HttpStatus HttpStatusFor(absl::StatusCode code);

// The reason phrase of an HTTP status code the front end sends ("Method Not
// Allowed"); "Unknown" for another.
const char* ReasonPhrase(int code);

// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or
// code points past U+10FFFF).
bool IsValidUtf8(absl::string_view text);

// The body of every error answer: {"error":"<message>"}, JSON-escaped; a
// message that is not UTF-8 has its non-ASCII bytes replaced by '?'.
std::string ErrorBody(absl::string_view message);

}  // namespace numaserve::serving::http
