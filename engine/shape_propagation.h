// Concrete shapes of every value for given input shapes, using the op
// registry's shape functions (independent of ONNX's symbolic inference, so
// it also resolves Reshape's -1 against a real batch size).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/graph.h"

namespace numaserve::engine {

// The graph inputs' shapes at `batch` rows: dynamic dims (-1) become batch.
std::vector<Shape> InputShapesForBatch(const Graph& graph, int64_t batch);

// Shapes indexed by ValueId; values never computed have an empty shape.
absl::StatusOr<std::vector<Shape>> PropagateShapes(const Graph& graph,
                                                   const std::vector<Shape>& input_shapes);

}  // namespace numaserve::engine
