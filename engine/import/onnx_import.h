// ONNX -> Graph. The only place that includes libonnx: parses the file,
// runs onnx::checker and ONNX shape inference (their exceptions stop here),
// and builds the engine's Graph with initializers as constants.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/ir/graph.h"

namespace numaserve::engine {

// Errors name the file: missing or unreadable file, unparsable protobuf,
// checker or shape-inference failures, unsupported ops ("node 'conv1' (op
// Conv) is not supported"), non-FP32 inputs, dynamic non-batch dims.
// Hostile files fail with an error too, never an allocation or a crash: an
// initializer's declared dims are checked (no negative dim, at most
// kernels::kMaxTensorElements elements) against the bytes it holds before
// anything is allocated, external data is refused, every shape computed at
// load is checked the same way (naming the node), and any exception from
// parsing, checking or building (std::bad_alloc included) becomes a status.
absl::StatusOr<Graph> ImportOnnxModel(const std::string& path);

}  // namespace numaserve::engine
