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
// Triton's clients (perf_analyzer, the C++ client's streams) ask with it
// that a stream mark each request's last response: ModelStreamInfer then
// sets the response parameter kFinalResponseParameter (true: every request
// here has exactly one response, so each is its last). A bool; accepted on
// ModelInfer too, where it changes nothing.
inline constexpr char kEmptyFinalResponseParameter[] = "triton_enable_empty_final_response";
inline constexpr char kFinalResponseParameter[] = "triton_final_response";

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
  // `triton_enable_empty_final_response`: mark the stream's response final.
  bool mark_final_response = false;
};

// Reads the request's parameters. INVALID_ARGUMENT naming the parameter for:
// `timeout` or `priority` that is not a non-negative integer (int64 or
// uint64), a timeout above kMaxRequestTimeoutMicroseconds, a priority above
// the model's levels; `profile` or `triton_enable_empty_final_response`
// that is not a bool (RequestsProfile);
// `sequence_id`, `sequence_start` or `sequence_end` (sequence batching is
// not supported); any other request parameter; any parameter of an input or
// an output (shared memory and classification named as unsupported).
absl::StatusOr<RequestParameters> ReadRequestParameters(const inference::ModelInferRequest& request,
                                                        const PriorityConfig& priorities);

}  // namespace numaserve::serving
