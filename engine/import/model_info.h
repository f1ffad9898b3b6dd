// ModelInfo from a model file (InspectModel) or an imported Graph
// (DescribeGraph): the metadata the server validates requests against.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/ir/types.h"

namespace numaserve::engine {

class Graph;  // engine/ir/graph.h

// Parses, checks (onnx::checker) and shape-infers the file; reads metadata.
// Errors name the file and the problem, including unsupported operators
// ("model.onnx: node 'conv1' uses unsupported op Conv").
absl::StatusOr<ModelInfo> InspectModel(const std::string& path);

// Output shapes come from propagating concrete shapes at batch 1 and 2
// (ProbeInputShapes: other dynamic dims at kProbeDims): a dim that follows
// the batch or another dynamic dim is reported as -1. Whether requests may be
// batched together comes from DescribeBatching (engine/ops/shape_propagation.h).
absl::StatusOr<ModelInfo> DescribeGraph(const Graph& graph, const std::string& path);

}  // namespace numaserve::engine
