// What the typed references (typed_ops.cc, typed_elementwise_ops.cc,
// quantize_ops.cc) share: their signatures' types, the checks of element
// types every one of them makes, and the rows that attach a typed
// reference to an op's registry entry. Internal to engine/ops.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/ir/graph.h"
#include "engine/ir/typed_tensor.h"
#include "engine/ops/op_registry.h"
#include "kernels/tensor.h"

namespace numaserve::engine::ops {

using TypedOr = absl::StatusOr<std::vector<TypedTensor>>;
using TypedIn = std::vector<const TypedTensor*>;
using Types = std::vector<DataType>;

inline TypedOr OneT(TypedTensor t) {
  std::vector<TypedTensor> out;
  out.push_back(std::move(t));
  return out;
}

inline bool Known(DataType t) { return t != DataType::kUnknown; }
inline bool Numeric(DataType t) { return IsIntegerType(t) || IsFloatType(t); }

// UNIMPLEMENTED naming the node: WHAT ("an input", "the output") of TYPE
// has no typed implementation.
absl::Status Refuse(const Node& node, DataType type, absl::string_view what);

// Every present input and every output of a type the engine knows.
absl::Status AllKnown(const Node& node, const Types& in, const Types& out);

// An op's typed reference and the check of the element types it accepts.
struct TypedRow {
  absl::string_view op;
  TypedOr (*run)(const Graph&, const Node&, const TypedIn&);
  absl::Status (*accepts)(const Node&, const Types&, const Types&);
};

// Sets typed_reference and typed_accepts of each row's op in TABLE. A
// row naming no op of TABLE sets nothing and is kept for
// TypedRowsWithoutOp.
void SetTypedRows(std::vector<OpSchema>& table, absl::Span<const TypedRow> rows);
// The ops of typed rows that named no op when they were set (a misspelt
// name or a row set before its op's): empty in a consistent registry
// (tests/engine/op_tables_test.cc).
std::vector<std::string> TypedRowsWithoutOp();

// An FP32 reference through the typed reference RUN: FP32 inputs as FP32
// typed tensors (constant inputs exactly as the graph holds them), the
// outputs converted to FP32 (index_ops.cc).
absl::StatusOr<std::vector<kernels::Tensor>> FloatThroughTyped(
    const Graph& graph, const Node& node, const std::vector<const kernels::Tensor*>& in,
    TypedOr (*run)(const Graph&, const Node&, const TypedIn&));

// INDEX (negative: from the end) into a dim of extent DIM, normalised;
// INVALID_ARGUMENT naming the node, the index, element ELEMENT and the
// node's input INPUT when it is out of range.
absl::StatusOr<int64_t> CheckedIndex(const Graph& graph, const Node& node, size_t input,
                                     int64_t element, int64_t index, int64_t dim);

// INVALID_ARGUMENT naming the node unless attribute NAME is 0 or 1.
absl::Status CheckFlag(const Node& node, const std::string& name, int64_t default_value);

// The element-wise rows: Add ... Xor, Pow, Where, Abs, Neg, Relu, Sign,
// Clip, Not (typed_elementwise_ops.cc).
absl::Span<const TypedRow> TypedElementwiseRows();

}  // namespace numaserve::engine::ops
