// The KServe v2 REST paths numaserve answers, and which method each takes.
// Pure: a path in, a route (or why not) out.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace numaserve::serving::http {

struct Route {
  enum class Kind {
    kLive,             // GET  /v2/health/live
    kReady,            // GET  /v2/health/ready
    kServerMetadata,   // GET  /v2
    kModelMetadata,    // GET  /v2/models/M[/versions/V]
    kModelReady,       // GET  /v2/models/M[/versions/V]/ready
    kModelConfig,      // GET  /v2/models/M[/versions/V]/config
    kModelStats,       // GET  /v2/models[/M[/versions/V]]/stats
    kInfer,            // POST /v2/models/M[/versions/V]/infer
    kRepositoryIndex,  // POST /v2/repository/index
    kLoad,             // POST /v2/repository/models/M/load
    kUnload,           // POST /v2/repository/models/M/unload
  };
  Kind kind = Kind::kLive;
  std::string model;           // percent-decoded; empty for the server's routes and all-model stats
  std::string version;         // percent-decoded; empty: the server's choice
  const char* method = "GET";  // the one method the route takes
  // The health routes are answered without a bearer token (as gRPC's
  // grpc.health.v1.Health is).
  bool open() const { return kind == Kind::kLive || kind == Kind::kReady; }
};

// The route of `path` (as sent, without the query; one trailing '/' is
// ignored). NOT_FOUND for a path that is none of the above; INVALID_ARGUMENT
// for a model or version that is not UTF-8, holds a NUL, or has a bad %-escape.
absl::StatusOr<Route> MatchRoute(absl::string_view path);

// `text` with its %XX escapes decoded; INVALID_ARGUMENT for a '%' not
// followed by two hex digits.
absl::StatusOr<std::string> PercentDecode(absl::string_view text);

}  // namespace numaserve::serving::http
