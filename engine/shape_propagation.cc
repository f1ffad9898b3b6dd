#include "engine/shape_propagation.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/op_registry.h"

namespace numaserve::engine {

std::vector<Shape> InputShapesForBatch(const Graph& graph, int64_t batch) {
  std::vector<Shape> shapes;
  for (ValueId id : graph.inputs()) {
    Shape s = graph.value(id).shape;
    for (int64_t& d : s) {
      if (d < 0) d = batch;
    }
    shapes.push_back(std::move(s));
  }
  return shapes;
}

absl::StatusOr<std::vector<Shape>> PropagateShapes(const Graph& graph,
                                                   const std::vector<Shape>& input_shapes) {
  if (input_shapes.size() != graph.inputs().size()) {
    return absl::InvalidArgumentError(absl::StrCat("expected ", graph.inputs().size(),
                                                   " input shapes, got ", input_shapes.size()));
  }
  std::vector<Shape> shapes(graph.num_values());
  std::vector<bool> known(graph.num_values(), false);
  for (size_t i = 0; i < input_shapes.size(); ++i) {
    shapes[graph.inputs()[i]] = input_shapes[i];
    known[graph.inputs()[i]] = true;
  }
  for (const auto& [id, constant] : graph.constants()) {
    shapes[id] = constant.shape;
    known[id] = true;
  }
  for (const Node& node : graph.nodes()) {
    const OpSchema* schema = FindOpSchema(node.op_type);
    if (schema == nullptr) {
      return absl::UnimplementedError(absl::StrCat(node.Describe(), " is not supported"));
    }
    std::vector<const Shape*> in;
    for (ValueId v : node.inputs) {
      if (v != kNoValue && !known[v]) {
        return absl::InvalidArgumentError(
            absl::StrCat(node.Describe(), ": input '", graph.value(v).name, "' is never computed"));
      }
      in.push_back(v == kNoValue ? nullptr : &shapes[v]);
    }
    auto out = schema->infer_shapes(graph, node, in);
    if (!out.ok()) return out.status();
    for (size_t i = 0; i < node.outputs.size() && i < out->size(); ++i) {
      shapes[node.outputs[i]] = (*out)[i];
      known[node.outputs[i]] = true;
    }
  }
  for (ValueId id : graph.outputs()) {
    if (!known[id]) {
      return absl::InvalidArgumentError(
          absl::StrCat("output '", graph.value(id).name, "' is never computed"));
    }
  }
  return shapes;
}

}  // namespace numaserve::engine
