// DataType helpers and InspectModel (engine/model.h).
#include "engine/model.h"

#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/model_info.h"
#include "engine/onnx_import.h"
#include "engine/op_registry.h"
#include "engine/shape_propagation.h"

namespace numaserve::engine {
namespace {

struct TypeRow {
  DataType type;
  const char* name;
  size_t size;
};

constexpr std::array<TypeRow, 13> kTypes = {{
    {DataType::kBool, "BOOL", 1},
    {DataType::kUint8, "UINT8", 1},
    {DataType::kInt8, "INT8", 1},
    {DataType::kInt16, "INT16", 2},
    {DataType::kUint16, "UINT16", 2},
    {DataType::kInt32, "INT32", 4},
    {DataType::kUint32, "UINT32", 4},
    {DataType::kInt64, "INT64", 8},
    {DataType::kUint64, "UINT64", 8},
    {DataType::kFloat16, "FP16", 2},
    {DataType::kBFloat16, "BF16", 2},
    {DataType::kFloat32, "FP32", 4},
    {DataType::kFloat64, "FP64", 8},
}};

}  // namespace

const char* DataTypeName(DataType type) {
  for (const TypeRow& row : kTypes) {
    if (row.type == type) return row.name;
  }
  return "UNKNOWN";
}

DataType DataTypeFromName(const std::string& name) {
  for (const TypeRow& row : kTypes) {
    if (name == row.name) return row.type;
  }
  return DataType::kUnknown;
}

size_t DataTypeSize(DataType type) {
  for (const TypeRow& row : kTypes) {
    if (row.type == type) return row.size;
  }
  return 0;
}

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
