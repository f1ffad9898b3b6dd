#include "engine/reference_executor.h"

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/op_registry.h"

namespace numaserve::engine {

absl::StatusOr<std::vector<kernels::Tensor>> RunReference(
    const Graph& graph, const std::vector<kernels::Tensor>& inputs) {
  if (inputs.size() != graph.inputs().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", graph.inputs().size(), " inputs, got ", inputs.size()));
  }
  std::vector<std::optional<kernels::Tensor>> computed(graph.num_values());
  for (size_t i = 0; i < inputs.size(); ++i) computed[graph.inputs()[i]] = inputs[i];
  auto lookup = [&](ValueId id) -> const kernels::Tensor* {
    if (id == kNoValue) return nullptr;
    if (computed[id].has_value()) return &*computed[id];
    const Constant* c = graph.FindConstant(id);
    // FP32 constants, and integer/bool ones through their FP32 copy.
    return c != nullptr && c->f32.shape == c->shape &&
                   static_cast<int64_t>(c->f32.data.size()) == kernels::NumElements(c->shape)
               ? &c->f32
               : nullptr;
  };
  for (const Node& node : graph.nodes()) {
    const OpSchema* schema = FindOpSchema(node.op_type);
    if (schema == nullptr) {
      return absl::UnimplementedError(absl::StrCat(node.Describe(), " is not supported"));
    }
    std::vector<const kernels::Tensor*> in;
    for (ValueId id : node.inputs) in.push_back(lookup(id));
    if (in.empty() || (in[0] == nullptr && node.inputs[0] != kNoValue)) {
      return absl::InvalidArgumentError(absl::StrCat(node.Describe(), ": first input missing"));
    }
    auto out = schema->reference(graph, node, in);
    if (!out.ok()) return out.status();
    for (size_t i = 0; i < node.outputs.size() && i < out->size(); ++i) {
      computed[node.outputs[i]] = std::move((*out)[i]);
    }
  }
  std::vector<kernels::Tensor> outputs;
  for (ValueId id : graph.outputs()) {
    const kernels::Tensor* t = lookup(id);
    if (t == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("output '", graph.value(id).name, "' was not computed"));
    }
    outputs.push_back(*t);
  }
  return outputs;
}

}  // namespace numaserve::engine
