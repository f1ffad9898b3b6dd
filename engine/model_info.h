// ModelInfo from an imported Graph: the metadata the server validates
// requests against.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/graph.h"
#include "engine/model.h"

namespace numaserve::engine {

// Output shapes come from propagating concrete shapes at batch 1 and 2:
// a dim that follows the batch is reported as -1. Whether requests may be
// batched together comes from DescribeBatching (engine/shape_propagation.h).
absl::StatusOr<ModelInfo> DescribeGraph(const Graph& graph, const std::string& path);

}  // namespace numaserve::engine
