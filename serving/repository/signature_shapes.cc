#include "serving/repository/signature_shapes.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/import/model_info.h"
#include "engine/import/onnx_import.h"
#include "engine/ops/shape_propagation.h"
#include "kernels/tensor.h"

namespace numaserve::serving {
namespace {

// Constants above this many elements keep their shape only: shape functions
// read Reshape's target, Slice's starts and the like, never a weight.
constexpr int64_t kShapeConstantElements = 1024;

}  // namespace

bool IsShapePolymorphic(const engine::ModelInfo& info) {
  for (const engine::TensorInfo& t : info.inputs) {
    for (size_t d = 1; d < t.shape.size(); ++d) {
      if (t.shape[d] < 0) return true;
    }
  }
  return false;
}

SignatureShapesFn MakeSignatureShapes(const engine::Graph& graph) {
  auto copy = std::make_shared<engine::Graph>(graph);
  std::vector<engine::ValueId> large;
  for (const auto& [id, c] : copy->constants()) {
    if (kernels::NumElements(c.shape) > kShapeConstantElements) large.push_back(id);
  }
  for (engine::ValueId id : large) {
    const engine::Constant& weights = *copy->FindConstant(id);
    engine::Constant shape_only;
    shape_only.type = weights.type;
    shape_only.shape = weights.shape;
    shape_only.f32.shape = weights.f32.shape;
    copy->SetConstant(id, std::move(shape_only));
  }
  std::shared_ptr<const engine::Graph> shapes_only = std::move(copy);
  return [shapes_only](const std::vector<std::vector<int64_t>>& input_shapes)
             -> absl::StatusOr<std::vector<std::vector<int64_t>>> {
    if (auto key = engine::CheckSignature(*shapes_only, input_shapes); !key.ok()) {
      return key.status();
    }
    auto shapes = engine::PropagateShapes(*shapes_only, input_shapes);
    if (!shapes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model cannot run at input shapes ",
          engine::DescribeSignature(*shapes_only, input_shapes), ": ", shapes.status().message()));
    }
    std::vector<std::vector<int64_t>> out;
    for (engine::ValueId v : shapes_only->outputs()) out.push_back((*shapes)[v]);
    return out;
  };
}

absl::StatusOr<InspectedModel> InspectModelWithSignatures(const std::string& path) {
  auto graph = engine::ImportOnnxModel(path);
  if (!graph.ok()) return graph.status();
  auto info = engine::DescribeGraph(*graph, path);
  if (!info.ok()) return info.status();
  InspectedModel inspected;
  inspected.info = *std::move(info);
  if (IsShapePolymorphic(inspected.info)) inspected.signature_shapes = MakeSignatureShapes(*graph);
  return inspected;
}

}  // namespace numaserve::serving
