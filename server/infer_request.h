// Checks a ModelInfer request against the model's metadata and finds its
// tensor bytes; builds the response from the outputs. Pure functions, so
// every bad-input case is unit-testable without a server.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "grpc_service.pb.h"

namespace numaserve::server {

struct ParsedRequest {
  int64_t rows = 1;  // the batch dimension's size (1 for unbatched models)
  // Per model input, in model order: the bytes of the tensor in the request.
  std::vector<std::pair<const char*, size_t>> inputs;
  // Which model outputs to return, in the order asked for (all if none asked).
  std::vector<int> outputs;
  // Bytes of every model output for `rows` rows, in model order.
  std::vector<size_t> output_bytes;
  std::vector<std::vector<int64_t>> output_shapes;
};

// INVALID_ARGUMENT naming the tensor and what was expected, for: a missing,
// unknown or repeated input; a datatype other than the model's; a shape of
// the wrong rank or dimensions, or inconsistent batch sizes; raw contents of
// the wrong byte count; a mix of raw and typed contents; an unknown output.
// An input whose declared shape needs more than `max_bytes` bytes (0: no
// limit) is refused from its shape alone, before its contents are looked at.
absl::StatusOr<ParsedRequest> ParseInferRequest(const engine::ModelInfo& model,
                                                const inference::ModelInferRequest& request,
                                                size_t max_bytes = 0);

// Fills outputs and raw_output_contents from `outputs` (one pointer per model output).
void FillInferResponse(const engine::ModelInfo& model, const ParsedRequest& parsed,
                       const std::vector<const char*>& outputs,
                       inference::ModelInferResponse* response);

std::string ShapeString(const std::vector<int64_t>& shape);  // "[-1,1,28,28]"

}  // namespace numaserve::server
