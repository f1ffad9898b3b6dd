// The shape values of PropagateShapesAndValues (shape_propagation.h):
// which nodes' outputs are ones, and computing them.
#include "engine/ops/shape_values.h"

#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/ops/shape_propagation.h"
#include "engine/ops/typed_exec.h"
#include "kernels/tensor.h"

namespace numaserve::engine {
namespace {

// The ops whose outputs may be shape values: their cost follows the
// elements they read and write (no contraction, no window), so that the
// values of one propagation cost at most about kMaxShapeValuesTotal steps
// of work however a file chains them.
bool ShapeValueOp(const std::string& op) {
  static constexpr absl::string_view kOps =
      " Shape Size Gather Unsqueeze Squeeze Concat Slice Reshape Flatten Identity Cast Add Sub Mul "
      "Div Mod Neg Abs Floor Ceil Sqrt Reciprocal Pow Max Min Sign Clip Equal Less Greater "
      "LessOrEqual GreaterOrEqual Not And Or Xor Where ConstantOfShape Range Expand Tile "
      "ReduceProd ReduceSum ReduceMax ReduceMin Transpose ";
  return !op.empty() && op.find(' ') == std::string::npos &&
         absl::StrContains(kOps, absl::StrCat(" ", op, " "));
}

}  // namespace

// Whether NODE reads a shape value (its values change with the signature).
bool ReadsShapeValue(const Node& node, const ShapeValues& values) {
  for (ValueId v : node.inputs) {
    if (v != kNoValue && values.contains(v)) return true;
  }
  return false;
}

// NODE's outputs as shape values (above), at output shapes OUT; nothing
// when it has none, or when they would take the values of this
// propagation past kMaxShapeValuesTotal elements (*TOTAL, added to).
std::optional<std::vector<TypedTensor>> ShapeValuesOf(const Graph& graph, const Node& node,
                                                      const OpSchema& schema,
                                                      const std::vector<const Shape*>& in,
                                                      const std::vector<Shape>& out,
                                                      const ShapeValues& values, int64_t* total) {
  if (schema.typed_reference == nullptr || out.size() != node.outputs.size() ||
      !ShapeValueOp(node.op_type)) {
    return std::nullopt;
  }
  int64_t elements = 0;
  for (const Shape& shape : out) elements += kernels::NumElements(shape);  // each checked
  if (elements > kMaxShapeValueElements || *total + elements > kMaxShapeValuesTotal) {
    return std::nullopt;
  }
  std::vector<TypedTensor> held;
  held.reserve(node.inputs.size());
  std::vector<const TypedTensor*> typed;
  static const uint8_t kNoData = 0;
  const bool reads_shape = node.op_type == "Shape" || node.op_type == "Size";
  if (reads_shape) {
    // The shape alone: a view without data.
    if (node.inputs.empty() || in[0] == nullptr) return std::nullopt;
    held.push_back(TypedTensor::View(DataType::kBool, *in[0], &kNoData));
    typed.push_back(&held.back());
  } else {
    if (!ReadsShapeValue(node, values)) return std::nullopt;
    for (ValueId v : node.inputs) {
      if (v == kNoValue) {
        typed.push_back(nullptr);
        continue;
      }
      const Constant* c = graph.FindConstant(v);  // a graph constant or a shape value
      if (c == nullptr) return std::nullopt;
      const int64_t n = kernels::NumElements(c->shape);
      if (!values.contains(v) && n > kMaxShapeValueConstantElements) return std::nullopt;
      auto t = ConstantAsTyped(*c);
      if (!t.ok()) return std::nullopt;
      held.push_back(*std::move(t));
      typed.push_back(&held.back());
    }
  }
  auto result = RunTypedNode(graph, node, typed);
  if (!result.ok() || result->size() != out.size()) return std::nullopt;
  for (size_t j = 0; j < out.size(); ++j) {
    if ((*result)[j].shape != out[j]) return std::nullopt;
  }
  *total += elements;
  return *std::move(result);
}

}  // namespace numaserve::engine
