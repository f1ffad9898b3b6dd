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

  // The two probes (batch 1 and 2, other dynamic dims at kProbeDims): a
  // dim of an output that differs between them follows a dynamic dim.
  auto at1 = PropagateShapes(graph, ProbeInputShapes(graph, 0));
  if (!at1.ok())
    return absl::Status(at1.status().code(), absl::StrCat(path, ": ", at1.status().message()));
  auto at2 = PropagateShapes(graph, ProbeInputShapes(graph, 1));
  if (!at2.ok())
    return absl::Status(at2.status().code(), absl::StrCat(path, ": ", at2.status().message()));

  for (ValueId id : graph.inputs()) {
    const Value& v = graph.value(id);
    std::vector<std::string> names = v.dim_names;
    names.resize(v.shape.size());
    info.inputs.push_back({v.name, v.type, v.shape, std::move(names)});
  }
  for (ValueId id : graph.outputs()) {
    const Value& v = graph.value(id);
    Shape shape = (*at1)[id];
    std::vector<std::string> names(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) {
      if (d >= (*at2)[id].size() || shape[d] != (*at2)[id][d]) {
        shape[d] = -1;
        // The file's name for it, where its declared output has one.
        if (v.shape.size() == shape.size() && d < v.dim_names.size()) names[d] = v.dim_names[d];
      }
    }
    info.outputs.push_back({v.name, v.type, shape, std::move(names)});
  }
  // Batched only when rows stay apart from input to output.
  if (absl::Status s = DescribeBatching(graph, &info); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }

  // FLOPs for one row: the whole graph at batch 1 (other dynamic dims at
  // the first probe's size).
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
