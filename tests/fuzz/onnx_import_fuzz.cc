// The ONNX importer on arbitrary bytes: ImportOnnxModel (protobuf parse,
// libonnx checker and shape inference, the engine's own checks, graph
// building) and DescribeGraph (InspectModel's metadata: shapes at 1 and 2
// rows, row independence). A model small enough at one row is then run on
// the reference executor with zero inputs, whose outputs must have the
// shapes the shape functions promised (what the server sizes its buffers
// by).
#include <cstdint>
#include <vector>

#include "engine/import/model_info.h"
#include "engine/import/onnx_import.h"
#include "engine/ir/typed_tensor.h"
#include "engine/model.h"
#include "engine/ops/shape_propagation.h"
#include "engine/reference/reference_executor.h"
#include "tests/fuzz/fuzz_target.h"

namespace numaserve::fuzz {
namespace {

// Runs on the reference executor only below these (it is slow and simple).
constexpr int64_t kMaxRunElements = int64_t{1} << 18;
constexpr double kMaxRunFlops = 2e7;

}  // namespace

int FuzzOne(const uint8_t* data, size_t size) {
  const std::string path = MemoryFile(0, AsText(data, size));
  absl::StatusOr<engine::Graph> graph = engine::ImportOnnxModel(path);
  if (!graph.ok()) return 0;
  absl::StatusOr<engine::ModelInfo> info = engine::DescribeGraph(*graph, path);
  if (!info.ok()) return 0;

  FUZZ_CHECK(info->inputs.size() == graph->inputs().size());
  FUZZ_CHECK(info->outputs.size() == graph->outputs().size());
  if (info->batched) {
    for (const engine::TensorInfo& in : info->inputs) {
      FUZZ_CHECK(!in.shape.empty() && in.shape[0] == -1);
    }
  }
  if (info->output_shapes_at) {
    for (int64_t rows : {1, 2, 3}) {
      auto shapes = info->output_shapes_at(rows);
      if (shapes.ok()) FUZZ_CHECK(shapes->size() == info->outputs.size());
    }
  }

  // Every value's shape at one row: small enough to run?
  absl::StatusOr<std::vector<kernels::Shape>> at1 =
      engine::PropagateShapes(*graph, engine::InputShapesForBatch(*graph, 1));
  FUZZ_CHECK(at1.ok());  // DescribeGraph succeeded on the same shapes
  int64_t elements = 0;
  for (const kernels::Shape& shape : *at1) {
    absl::StatusOr<int64_t> n = kernels::NumElementsChecked(shape);
    if (!n.ok()) return 0;
    elements += *n;
    if (elements > kMaxRunElements) return 0;
  }
  if (info->flops_per_row > kMaxRunFlops) return 0;

  std::vector<engine::TypedTensor> inputs;
  for (engine::ValueId id : graph->inputs()) {
    inputs.emplace_back(graph->value(id).type, (*at1)[id]);
  }
  absl::StatusOr<std::vector<engine::TypedTensor>> outputs =
      engine::RunReferenceTyped(*graph, inputs);
  if (!outputs.ok()) return 0;
  FUZZ_CHECK(outputs->size() == graph->outputs().size());
  for (size_t i = 0; i < outputs->size(); ++i) {
    const engine::TypedTensor& out = (*outputs)[i];
    FUZZ_CHECK(out.shape == (*at1)[graph->outputs()[i]]);
    FUZZ_CHECK(out.view != nullptr ||
               out.bytes.size() == static_cast<size_t>(out.size()) * out.element_size());
  }
  return 0;
}

}  // namespace numaserve::fuzz
