// Helpers shared by the op registry's tables (engine/ops/*_ops.cc):
// arity checks, node-named errors, constant-input and attribute readers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/ir/graph.h"
#include "engine/ops/op_registry.h"
#include "kernels/tensor.h"

namespace numaserve::engine::ops {

using kernels::Tensor;
using ShapesOr = absl::StatusOr<std::vector<Shape>>;
using TensorsOr = absl::StatusOr<std::vector<Tensor>>;

absl::Status NodeError(const Node& node, absl::string_view message);
absl::Status NodeUnsupported(const Node& node, absl::string_view message);

// Inputs in [min_in, max_in] (the first present) and outputs in
// [min_out, max_out].
absl::Status CheckArity(const Node& node, size_t min_in, size_t max_in, size_t min_out = 1,
                        size_t max_out = 1);

TensorsOr One(absl::StatusOr<Tensor> t);
TensorsOr One(Tensor t);

double NoFlops(const Node&, const std::vector<const Shape*>&);
ShapesOr SameShape(const Graph&, const Node&, const std::vector<const Shape*>& in);

// The input at `index` when present (not omitted).
bool HasInput(const Node& node, size_t index);

// A constant integer input (INT64/INT32/BOOL initializer or folded value);
// an error naming the node when the input is present but not constant.
absl::StatusOr<std::optional<std::vector<int64_t>>> ConstInts(const Graph& graph, const Node& node,
                                                              size_t index, absl::string_view what);

// From attribute `attr` when set, else from the constant input `index`.
absl::StatusOr<std::optional<std::vector<int64_t>>> IntsFromAttrOrInput(const Graph& graph,
                                                                        const Node& node,
                                                                        const std::string& attr,
                                                                        size_t index);

// A constant float input's values (nullopt when omitted).
absl::StatusOr<std::optional<std::vector<float>>> ConstFloats(const Graph& graph, const Node& node,
                                                              size_t index, absl::string_view what);

// OK when `shape` is a tensor shape the engine can hold (no negative dim,
// at most kernels::kMaxTensorElements elements); INVALID_ARGUMENT naming the
// node and `what` ("the output", "the target shape") otherwise.
absl::Status CheckShape(const Node& node, const Shape& shape, absl::string_view what);

// a + b and a * b with a node-named error when the result overflows int64
// (attribute and constant values are the model's, so anything goes).
absl::StatusOr<int64_t> NodeAdd(const Node& node, int64_t a, int64_t b, absl::string_view what);
absl::StatusOr<int64_t> NodeMul(const Node& node, int64_t a, int64_t b, absl::string_view what);

// Normalises axes against `rank`, with a node-named error.
absl::StatusOr<std::vector<int64_t>> NormalizeAxes(const Node& node, std::vector<int64_t> axes,
                                                   int64_t rank);

}  // namespace numaserve::engine::ops
