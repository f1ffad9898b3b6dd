// Which nodes run on typed tensors and how: a node that reads a runtime
// (non-constant) value of a type other than FP32, or writes one, runs on its
// op's typed reference (OpSchema::typed_reference); one without a typed
// reference for those types is refused at load. Also conversions between
// graph constants and typed tensors.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "engine/ir/graph.h"
#include "engine/ir/typed_tensor.h"

namespace numaserve::engine {

// A value's element type at runtime: Value::type, FP32 where unknown.
DataType RuntimeType(const Graph& graph, ValueId id);

// True when the node reads a runtime value or writes a value whose type is
// not FP32.
bool NeedsTypedRun(const Graph& graph, const Node& node);

// OK when the node's op has a typed reference accepting its input and
// output types; UNIMPLEMENTED naming the node, the value and its type
// otherwise ("node 'c1' (op Conv): input 'ids' is INT64; Conv runs on FP32
// only").
absl::Status CheckTypedNode(const Graph& graph, const Node& node);

// The constant's exact elements as a typed tensor.
absl::StatusOr<TypedTensor> ConstantAsTyped(const Constant& c);
// A graph constant holding `t` (bytes, integer values and an FP32 copy).
Constant ConstantFromTyped(TypedTensor t);

// Runs the node's typed reference; inputs[i] is null for an omitted input.
absl::StatusOr<std::vector<TypedTensor>> RunTypedNode(
    const Graph& graph, const Node& node, const std::vector<const TypedTensor*>& inputs);

}  // namespace numaserve::engine
