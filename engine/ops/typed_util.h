// What the typed references (typed_ops.cc, typed_elementwise_ops.cc,
// quantize_ops.cc) share: their signatures' types, the checks of element
// types every one of them makes, and the rows that attach a typed
// reference to an op's registry entry. Internal to engine/ops.
#pragma once

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/ir/graph.h"
#include "engine/ir/typed_tensor.h"
#include "engine/ops/op_registry.h"

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

// Sets typed_reference and typed_accepts of each row's op in TABLE.
void SetTypedRows(std::vector<OpSchema>& table, absl::Span<const TypedRow> rows);

// The element-wise rows: Add ... Xor, Pow, Where, Abs, Neg, Relu, Sign,
// Clip, Not (typed_elementwise_ops.cc).
absl::Span<const TypedRow> TypedElementwiseRows();

}  // namespace numaserve::engine::ops
