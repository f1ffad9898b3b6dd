// Helpers of PropagateShapesAndValues (shape_propagation.h): which nodes'
// outputs are shape values, and computing them.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/ir/graph.h"
#include "engine/ir/typed_tensor.h"
#include "engine/ops/op_registry.h"

namespace numaserve::engine {

// Whether NODE reads a shape value (its values change with the signature).
bool ReadsShapeValue(const Node& node, const ShapeValues& values);

// NODE's outputs as shape values, its inputs of shapes IN and its outputs
// of shapes OUT (inferred), VALUES those computed before it; nothing when
// they are none (shape_propagation.h says which are), or when they would
// take the values of one propagation past kMaxShapeValuesTotal elements
// (*TOTAL, the elements so far, is added to).
std::optional<std::vector<TypedTensor>> ShapeValuesOf(const Graph& graph, const Node& node,
                                                      const OpSchema& schema,
                                                      const std::vector<const Shape*>& in,
                                                      const std::vector<Shape>& out,
                                                      const ShapeValues& values, int64_t* total);

}  // namespace numaserve::engine
