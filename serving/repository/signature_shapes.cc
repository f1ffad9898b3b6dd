#include "serving/repository/signature_shapes.h"

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "engine/import/model_info.h"
#include "engine/import/onnx_import.h"
#include "engine/ops/shape_propagation.h"
#include "kernels/bounded_cache.h"
#include "kernels/tensor.h"

namespace numaserve::serving {
namespace {

// Constants above this many elements keep their shape only: shape functions
// read Reshape's target, Slice's starts and the like, never a weight.
constexpr int64_t kShapeConstantElements = 1024;

// Signatures whose answers are kept: propagating shapes (and the values
// the graph computes from them) costs a walk over the graph, which a
// request of a signature seen before does not pay again.
constexpr size_t kSignaturesKept = 1024;

using OutputShapes = absl::StatusOr<std::vector<std::vector<int64_t>>>;

// The answers for the signatures seen last, behind a lock (the front end's
// threads size requests at once).
struct SignatureAnswers {
  base::Mutex mu;
  kernels::BoundedCache<std::vector<int64_t>, OutputShapes> kept ABSL_GUARDED_BY(mu){
      kSignaturesKept};
};

// A signature as one key: each input's rank, then its dims.
std::vector<int64_t> SignatureKey(const std::vector<std::vector<int64_t>>& input_shapes) {
  std::vector<int64_t> key;
  for (const auto& shape : input_shapes) {
    key.push_back(static_cast<int64_t>(shape.size()));
    key.insert(key.end(), shape.begin(), shape.end());
  }
  return key;
}

OutputShapes Propagate(const engine::Graph& graph,
                       const std::vector<std::vector<int64_t>>& input_shapes) {
  if (auto key = engine::CheckSignature(graph, input_shapes); !key.ok()) return key.status();
  auto shapes = engine::PropagateShapes(graph, input_shapes);
  if (!shapes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the model cannot run at input shapes ",
                                                   engine::DescribeSignature(graph, input_shapes),
                                                   ": ", shapes.status().message()));
  }
  std::vector<std::vector<int64_t>> out;
  for (engine::ValueId v : graph.outputs()) out.push_back((*shapes)[v]);
  return out;
}

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
  auto answers = std::make_shared<SignatureAnswers>();
  return [shapes_only,
          answers](const std::vector<std::vector<int64_t>>& input_shapes) -> OutputShapes {
    std::vector<int64_t> key = SignatureKey(input_shapes);
    {
      base::MutexLock lock(&answers->mu);
      if (const OutputShapes* kept = answers->kept.Find(key)) return *kept;
    }
    OutputShapes out = Propagate(*shapes_only, input_shapes);
    base::MutexLock lock(&answers->mu);
    answers->kept.Emplace(std::move(key), out);
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
