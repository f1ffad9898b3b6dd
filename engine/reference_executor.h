// Runs a Graph op by op on the scalar reference kernels. Slow and simple:
// the oracle that fast paths are tested against.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "engine/graph.h"
#include "kernels/tensor.h"

namespace numaserve::engine {

// inputs[i] is graph.inputs()[i] with its concrete shape; returns the
// graph outputs in order.
absl::StatusOr<std::vector<kernels::Tensor>> RunReference(
    const Graph& graph, const std::vector<kernels::Tensor>& inputs);

}  // namespace numaserve::engine
