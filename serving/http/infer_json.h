// KServe v2 REST inference bodies <-> the ModelInferRequest and
// ModelInferResponse messages the inference service takes and fills, with
// Triton's binary tensor data extension. Pure functions over bytes, so
// every hostile body is unit-testable without a server.
//
// A request body is JSON, or JSON followed by binary tensor data when the
// request's Inference-Header-Content-Length header gives the JSON's length:
//
//   {"id": "...", "parameters": {...},
//    "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3],
//                "data": [1, 2, 3, 4, 5, 6]},                  (flat or nested, row-major)
//               {"name": "y", "datatype": "INT64", "shape": [2],
//                "parameters": {"binary_data_size": 16}}],     (16 bytes of the binary part)
//    "outputs": [{"name": "z", "parameters": {"binary_data": true}}]}
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpc_service.pb.h"
#include "serving/request/infer_request.h"

namespace numaserve::serving::http {

// A request as the inference service takes it, and how its outputs go back.
struct JsonInferRequest {
  // id, parameters, inputs (name, datatype, shape) and the outputs asked
  // for; no raw_input_contents (they are in `inputs`). model_name and
  // model_version are left to the caller (they come from the URL).
  inference::ModelInferRequest request;
  // Each input's bytes, in the request's order, little-endian in the
  // input's datatype (BOOL one byte 0 or 1; BYTES each element as a 4-byte
  // little-endian length and its bytes): a binary part where it lies in the
  // body (read in place), data converted from JSON in buffers `inputs`
  // owns. For StartInference's TransportBuffers.
  std::shared_ptr<const TransportInputs> inputs;
  // The request parameter binary_data_output: every output in the binary
  // part unless the output's own binary_data says otherwise.
  bool binary_outputs = false;
  // Outputs whose binary_data parameter was given, by name.
  std::map<std::string, bool> output_binary;
};

// Parses a request body: `json` is its JSON part and `binary` what follows
// it (empty without Inference-Header-Content-Length). The values of `data`
// are converted to the input's datatype as they are read (integers range-
// checked, FP16 and BF16 rounded to nearest even, NaN and +-Infinity taken
// for floating-point types, BOOL from true and false, BYTES from strings).
// An input's declared shape is checked before anything is allocated for
// it: no negative dims, and at most `max_tensor_bytes` bytes.
//
// INVALID_ARGUMENT naming the input (and the index of the value) for: a
// body that is not JSON or not UTF-8; unknown or repeated fields; an input
// without a name, datatype or shape, or with both or neither of data and
// binary_data_size; an unknown datatype; a shape that is not an array of
// non-negative integers; more or fewer values than the shape holds; a
// value of the wrong JSON type or outside the datatype's range; binary data
// sizes that run past the end of the body or leave bytes unread; nesting
// deeper than 32 levels; the classification extension.
// `binary` comes in the pieces the body arrived in, laid end to end; the
// request points into them and keeps `binary_owner` (what keeps them
// valid; may be null where the caller keeps them valid as long as the
// request).
absl::StatusOr<JsonInferRequest> ParseJsonInferRequest(absl::string_view json,
                                                       const std::vector<absl::string_view>& binary,
                                                       std::shared_ptr<const void> binary_owner,
                                                       size_t max_tensor_bytes);
// The same with the binary part in one piece, which must outlive the
// request.
absl::StatusOr<JsonInferRequest> ParseJsonInferRequest(absl::string_view json,
                                                       absl::string_view binary,
                                                       size_t max_tensor_bytes);

// A response body: `json` is its JSON part; `binary` the binary parts that
// follow it, in order (each points into the response message).
struct JsonInferReply {
  std::string json;
  std::vector<absl::string_view> binary;
};

// {"model_name", "model_version", "id", "parameters", "outputs": [{"name",
// "datatype", "shape", "data": [...] (flat, row-major)}]}; an output sent
// as binary data has parameters.binary_data_size instead of data, and its
// raw bytes in `binary`. Which outputs are binary: `request`'s choices.
JsonInferReply FormatJsonInferResponse(const inference::ModelInferResponse& response,
                                       const JsonInferRequest& request);

}  // namespace numaserve::serving::http
