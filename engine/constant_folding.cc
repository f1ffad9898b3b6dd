#include "engine/constant_folding.h"

#include <cmath>
#include <optional>

#include "engine/op_registry.h"
#include "engine/shape_propagation.h"

namespace numaserve::engine {
namespace {

bool IsIntegerType(DataType type) {
  return type == DataType::kInt64 || type == DataType::kInt32 || type == DataType::kBool ||
         type == DataType::kInt8 || type == DataType::kUint8;
}

Constant MakeConstant(DataType type, kernels::Tensor t) {
  Constant c;
  c.type = type == DataType::kUnknown ? DataType::kFloat32 : type;
  c.shape = t.shape;
  if (IsIntegerType(c.type)) {
    c.i64.reserve(t.data.size());
    for (float v : t.data) c.i64.push_back(static_cast<int64_t>(std::llround(v)));
  }
  c.f32 = std::move(t);
  return c;
}

}  // namespace

absl::StatusOr<int> FoldConstants(Graph& graph) {
  // Concrete shapes at two batch sizes: a value whose shape is the same at
  // both does not depend on the batch.
  const int n = graph.num_values();
  std::vector<std::optional<Shape>> at1(n), at2(n);
  const std::vector<Shape> in1 = InputShapesForBatch(graph, 1), in2 = InputShapesForBatch(graph, 2);
  for (size_t i = 0; i < graph.inputs().size(); ++i) {
    at1[graph.inputs()[i]] = in1[i];
    at2[graph.inputs()[i]] = in2[i];
  }
  for (const auto& [id, c] : graph.constants()) at1[id] = at2[id] = c.shape;

  std::vector<bool> folded(graph.nodes().size(), false);
  int count = 0;
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    const Node& node = graph.nodes()[i];
    const OpSchema* schema = FindOpSchema(node.op_type);
    if (schema == nullptr) continue;
    bool all_const = true, shapes_known = true;
    for (ValueId v : node.inputs) {
      if (v == kNoValue) continue;
      all_const = all_const && graph.IsConstant(v);
      shapes_known = shapes_known && at1[v].has_value() && at2[v].has_value();
    }
    std::optional<std::vector<kernels::Tensor>> result;
    if (all_const && !node.inputs.empty() && schema->validate(graph, node).ok()) {
      std::vector<const kernels::Tensor*> in;
      for (ValueId v : node.inputs) {
        in.push_back(v == kNoValue ? nullptr : &graph.FindConstant(v)->f32);
      }
      if (auto out = schema->reference(graph, node, in); out.ok()) result = *std::move(out);
    } else if ((node.op_type == "Shape" || node.op_type == "Size") && shapes_known &&
               *at1[node.inputs[0]] == *at2[node.inputs[0]]) {
      // Only the shape is read (Size reads the element count).
      kernels::Tensor placeholder(*at1[node.inputs[0]]);
      if (auto out = schema->reference(graph, node, {&placeholder}); out.ok()) {
        result = *std::move(out);
      }
    }
    if (result.has_value() && result->size() == node.outputs.size()) {
      for (size_t j = 0; j < node.outputs.size(); ++j) {
        const ValueId out = node.outputs[j];
        Value& value = graph.value(out);
        value.shape = (*result)[j].shape;
        value.has_shape = true;
        at1[out] = at2[out] = value.shape;
        graph.SetConstant(out, MakeConstant(value.type, std::move((*result)[j])));
        if (value.type == DataType::kUnknown) value.type = graph.FindConstant(out)->type;
      }
      folded[i] = true;
      ++count;
      continue;
    }
    if (!shapes_known) continue;
    std::vector<const Shape*> s1, s2;
    for (ValueId v : node.inputs) {
      s1.push_back(v == kNoValue ? nullptr : &*at1[v]);
      s2.push_back(v == kNoValue ? nullptr : &*at2[v]);
    }
    auto o1 = schema->infer_shapes(graph, node, s1);
    auto o2 = schema->infer_shapes(graph, node, s2);
    if (!o1.ok() || !o2.ok()) continue;
    for (size_t j = 0; j < node.outputs.size() && j < o1->size(); ++j) {
      at1[node.outputs[j]] = (*o1)[j];
      at2[node.outputs[j]] = (*o2)[j];
    }
  }
  if (count > 0) {
    std::vector<Node> kept;
    for (size_t i = 0; i < graph.nodes().size(); ++i) {
      if (!folded[i]) kept.push_back(std::move(graph.nodes()[i]));
    }
    graph.nodes() = std::move(kept);
  }
  return count;
}

}  // namespace numaserve::engine
