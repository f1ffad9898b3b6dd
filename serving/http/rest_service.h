// The KServe v2 REST API (Open Inference Protocol over HTTP, with Triton's
// binary tensor data, statistics, configuration and repository
// extensions): HttpServer's handler. Every call goes through the same
// InferenceService as gRPC's, so both protocols share the model manager,
// the scheduler, the in-flight byte budget, the limits and the statistics;
// this layer only turns paths and JSON into the service's messages and
// back (rest_routes.h, infer_json.h), and statuses into HTTP statuses
// (http_status.h). docs/api.md describes the endpoints.
#pragma once

#include <cstddef>

#include "serving/frontend/grpc_auth.h"
#include "serving/frontend/inference_service.h"
#include "serving/http/http_server.h"
#include "serving/http/rest_routes.h"

namespace numaserve::serving::http {

class RestService {
 public:
  struct Options {
    // The gRPC message limit (--grpc-max-message-bytes): the largest
    // tensor a request may declare. (HttpServer's max_body_bytes, the
    // same value, bounds the body.)
    size_t max_message_bytes = size_t{64} << 20;
    // The largest body of the repository calls (index, load, unload),
    // whose bodies are a few fields at most.
    size_t max_control_body_bytes = size_t{64} << 10;
  };

  // `service` and `auth` (the gRPC port's TLS and tokens: the same bearer
  // tokens are asked for) must outlive it.
  RestService(const Options& options, InferenceService* service, const GrpcAuth* auth);

  // HttpServer's handler: answers `exchange` exactly once.
  void Handle(HttpExchange* exchange);

 private:
  // False when the exchange was answered 401 (a missing, repeated or
  // unknown bearer token where the server asks for one).
  bool Authorize(HttpExchange* exchange) const;
  void Infer(HttpExchange* exchange, const Route& route);
  void RepositoryIndex(HttpExchange* exchange);
  void LoadOrUnload(HttpExchange* exchange, const Route& route);
  void Metadata(HttpExchange* exchange, const Route& route);

  const Options options_;
  InferenceService* const service_;
  const GrpcAuth* const auth_;
};

}  // namespace numaserve::serving::http
