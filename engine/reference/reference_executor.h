// Runs a Graph op by op on the scalar reference kernels. Slow and simple:
// the oracle that fast paths are tested against.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "engine/ir/graph.h"
#include "engine/ir/typed_tensor.h"
#include "kernels/tensor.h"

namespace numaserve::engine {

// inputs[i] is graph.inputs()[i] with its concrete shape and its type;
// returns the graph outputs in order, each of its type. Nodes touching
// values of types other than FP32 run on their typed reference, the others
// on the FP32 one.
absl::StatusOr<std::vector<TypedTensor>> RunReferenceTyped(const Graph& graph,
                                                           const std::vector<TypedTensor>& inputs);

// The same for a graph whose inputs are FP32: outputs converted to FP32.
absl::StatusOr<std::vector<kernels::Tensor>> RunReference(
    const Graph& graph, const std::vector<kernels::Tensor>& inputs);

}  // namespace numaserve::engine
