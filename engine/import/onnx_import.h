// ONNX -> Graph. engine/import is the only place that includes libonnx:
// parses the file, runs onnx::checker and ONNX shape inference (their
// exceptions stop here), and builds the engine's Graph with initializers as
// constants (onnx_read.cc), If and Loop decided at load inlined
// (control_flow.cc).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/import/constant_folding.h"
#include "engine/ir/graph.h"

namespace numaserve::engine {

struct ImportOptions {
  // Bytes constant folding may hold for the whole graph; 0 for the default
  // (kMinFoldBudgetBytes, or kFoldBudgetPerConstantByte times what the
  // model's own constants hold where that is more; constant_folding.h).
  int64_t fold_budget_bytes = 0;
};

// Errors name the file: missing or unreadable file, unparsable protobuf,
// checker or shape-inference failures, unsupported ops ("node 'conv1' (op
// Conv) is not supported"), non-FP32 inputs, dynamic non-batch dims.
// Hostile files fail with an error too, never an allocation or a crash: an
// initializer's declared dims are checked (no negative dim, at most
// kernels::kMaxTensorElements elements) against the bytes it holds before
// anything is allocated, external data is read only from regular files in
// the model's folder and at most each file's size from each
// (external_data.h), every shape computed at
// load is checked the same way (naming the node), and any exception from
// parsing, checking or building (std::bad_alloc included) becomes a status.
// Constant folding holds what it computes to a budget per graph (checked
// before each folded output is allocated); a model whose constants would
// fold past it is RESOURCE_EXHAUSTED, naming the node and the budget.
// FOLDING, when given, receives what folding held and its budget.
absl::StatusOr<Graph> ImportOnnxModel(const std::string& path, const ImportOptions& options = {},
                                      FoldResult* folding = nullptr);

}  // namespace numaserve::engine
