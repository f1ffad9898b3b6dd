// DescribeGraph and InspectModel (engine/import/model_info.h).
#include "engine/import/model_info.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/import/onnx_import.h"
#include "engine/ir/graph.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/shape_propagation.h"

namespace numaserve::engine {

absl::StatusOr<ModelInfo> DescribeGraph(const Graph& graph, const std::string& path) {
  ModelInfo info;
  info.path = path;
  info.opset = graph.opset();
  for (const auto& [id, constant] : graph.constants()) info.parameter_bytes += constant.ByteSize();

  auto at1 = PropagateShapes(graph, InputShapesForBatch(graph, 1));
  if (!at1.ok())
    return absl::Status(at1.status().code(), absl::StrCat(path, ": ", at1.status().message()));
  auto at2 = PropagateShapes(graph, InputShapesForBatch(graph, 2));
  if (!at2.ok())
    return absl::Status(at2.status().code(), absl::StrCat(path, ": ", at2.status().message()));

  for (ValueId id : graph.inputs()) {
    const Value& v = graph.value(id);
    info.inputs.push_back({v.name, v.type, v.shape});
  }
  for (ValueId id : graph.outputs()) {
    const Value& v = graph.value(id);
    Shape shape = (*at1)[id];
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] != (*at2)[id][d]) shape[d] = -1;
    }
    info.outputs.push_back({v.name, v.type, shape});
  }
  // Batched only when rows stay apart from input to output.
  if (absl::Status s = DescribeBatching(graph, &info); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }

  // FLOPs for one row: the whole graph at batch 1.
  for (const Node& node : graph.nodes()) {
    std::vector<const Shape*> in;
    for (ValueId v : node.inputs) in.push_back(v == kNoValue ? nullptr : &(*at1)[v]);
    info.flops_per_row += FindOpSchema(node.op_type)->flops(node, in);
  }
  return info;
}

absl::StatusOr<ModelInfo> InspectModel(const std::string& path) {
  auto graph = ImportOnnxModel(path);
  if (!graph.ok()) return graph.status();
  return DescribeGraph(*graph, path);
}

}  // namespace numaserve::engine
