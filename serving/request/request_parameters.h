// The parameters of a ModelInfer request (KServe v2, as Triton's clients
// send them) and of its input and output tensors: each one is honoured or
// refused, none is ignored. The HTTP front end takes its own
// (binary_data_output, binary_data_size, binary_data) out of the request
// before it gets here. docs/api.md has the table.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "grpc_service.pb.h"

namespace numaserve::serving {

// Request parameter names (Triton's).
inline constexpr char kTimeoutParameter[] = "timeout";
inline constexpr char kPriorityParameter[] = "priority";

// The largest `timeout` accepted, in microseconds (24 hours): far below
// where it would overflow as a clock duration.
inline constexpr uint64_t kMaxRequestTimeoutMicroseconds = uint64_t{24} * 3600 * 1000 * 1000;

// A model's priority levels (dynamic_batching.priority_levels and
// default_priority_level; 0 where unset).
struct PriorityConfig {
  uint64_t levels = 0;
  uint64_t default_level = 0;
};

struct RequestParameters {
  // `profile`: the request asks for its batch's step profile.
  bool profile = false;
  // `timeout` in microseconds; 0: the request sets none.
  uint64_t timeout_us = 0;
  // The request's level, 1 (highest) .. the model's levels: `priority`, or
  // the model's default level where the request asks for none (0 or absent).
  uint64_t priority = 1;
};

// Reads the request's parameters. INVALID_ARGUMENT naming the parameter for:
// `timeout` or `priority` that is not a non-negative integer (int64 or
// uint64), a timeout above kMaxRequestTimeoutMicroseconds, a priority above
// the model's levels; `profile` that is not a bool (RequestsProfile);
// `sequence_id`, `sequence_start` or `sequence_end` (sequence batching is
// not supported); any other request parameter; any parameter of an input or
// an output (shared memory and classification named as unsupported).
absl::StatusOr<RequestParameters> ReadRequestParameters(const inference::ModelInferRequest& request,
                                                        const PriorityConfig& priorities);

}  // namespace numaserve::serving
