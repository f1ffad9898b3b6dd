#include "engine/reference/reference_executor.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/shape_propagation.h"
#include "engine/ops/typed_exec.h"

namespace numaserve::engine {

namespace {

// The values a reference run has computed, by ValueId, and the constants it
// has read as typed tensors (converted once).
struct ReferenceValues {
  const Graph& graph;
  std::vector<std::optional<TypedTensor>> computed;
  std::vector<std::optional<TypedTensor>> constants;

  // Value `id` as a typed tensor: computed, or a constant; null for an
  // omitted input, an error for a value not computed yet.
  absl::StatusOr<const TypedTensor*> Typed(ValueId id) {
    if (id == kNoValue) return nullptr;
    if (const std::optional<TypedTensor>& value = computed[id]; value.has_value()) return &*value;
    const Constant* c = graph.FindConstant(id);
    if (c == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("value '", graph.value(id).name, "' is read before it is computed"));
    }
    std::optional<TypedTensor>& constant = constants[id];
    if (!constant.has_value()) {
      auto t = ConstantAsTyped(*c);
      if (!t.ok()) return t.status();
      constant = *std::move(t);
    }
    return &*constant;
  }
};

// Runs an FP32 node's reference (`schema`'s) on FP32 copies of its inputs.
absl::StatusOr<std::vector<TypedTensor>> RunFloatReference(ReferenceValues& values,
                                                           const Node& node,
                                                           const OpSchema& schema) {
  const Graph& graph = values.graph;
  std::vector<TypedTensor> out;
  // FP32 values; constants (of any type) through their FP32 copy.
  std::vector<kernels::Tensor> held(node.inputs.size());
  std::vector<const kernels::Tensor*> in;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const ValueId id = node.inputs[i];
    if (id == kNoValue) {
      in.push_back(nullptr);
    } else if (const std::optional<TypedTensor>& value = values.computed[id]; value.has_value()) {
      held[i] = value->ToFloat();
      in.push_back(&held[i]);
    } else if (const Constant* c = graph.FindConstant(id);
               c != nullptr && c->f32.shape == c->shape &&
               static_cast<int64_t>(c->f32.data.size()) == kernels::NumElements(c->shape)) {
      in.push_back(&c->f32);
    } else {
      // A constant without a whole FP32 copy converts from its typed
      // value; a value nothing computed is an error (never a null input
      // to an op's reference).
      auto t = values.Typed(id);
      if (!t.ok()) return t.status();
      held[i] = (*t)->ToFloat();
      in.push_back(&held[i]);
    }
  }
  if (in[0] == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(node.Describe(), ": first input missing"));
  }
  auto r = schema.reference(graph, node, in);
  if (!r.ok()) return r.status();
  for (kernels::Tensor& t : *r) out.push_back(TypedTensor::FromFloat(t));
  return out;
}

// Runs one node's reference (typed, or FP32) on the values computed so far:
// its outputs.
absl::StatusOr<std::vector<TypedTensor>> RunReferenceNode(ReferenceValues& values,
                                                          const Node& node) {
  const Graph& graph = values.graph;
  const OpSchema* schema = FindOpSchema(node.op_type);
  if (schema == nullptr) {
    return absl::UnimplementedError(absl::StrCat(node.Describe(), " is not supported"));
  }
  if (node.inputs.empty() || node.inputs[0] == kNoValue) {
    return absl::InvalidArgumentError(absl::StrCat(node.Describe(), ": first input missing"));
  }
  if (!NeedsTypedRun(graph, node)) return RunFloatReference(values, node, *schema);
  std::vector<const TypedTensor*> in;
  for (ValueId id : node.inputs) {
    auto t = values.Typed(id);
    if (!t.ok()) return t.status();
    in.push_back(*t);
  }
  return RunTypedNode(graph, node, in);
}

}  // namespace

absl::StatusOr<std::vector<TypedTensor>> RunReferenceTyped(const Graph& graph,
                                                           const std::vector<TypedTensor>& inputs) {
  if (inputs.size() != graph.inputs().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", graph.inputs().size(), " inputs, got ", inputs.size()));
  }
  ReferenceValues values{graph, std::vector<std::optional<TypedTensor>>(graph.num_values()), {}};
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ValueId id = graph.inputs()[i];
    if (inputs[i].type != RuntimeType(graph, id)) {
      return absl::InvalidArgumentError(absl::StrCat("input '", graph.value(id).name, "' is ",
                                                     DataTypeName(inputs[i].type), ", expected ",
                                                     DataTypeName(RuntimeType(graph, id))));
    }
    values.computed[id] = inputs[i];
  }
  // Constants read as typed tensors, converted once.
  values.constants.resize(graph.num_values());
  // What the run has computed, where small, answers for the graph's
  // constants too: a Reshape's target or a Slice's ends computed in the
  // graph (from shapes) are read as the values this run computed, not
  // through the engine's per-signature shape values.
  ShapeValues small;
  const ScopedShapeValues scope(&graph, &small);
  for (const Node& node : graph.nodes()) {
    auto out = RunReferenceNode(values, node);
    if (!out.ok()) return out.status();
    for (size_t i = 0; i < node.outputs.size() && i < out->size(); ++i) {
      const ValueId id = node.outputs[i];
      if ((*out)[i].size() <= kMaxShapeValueElements && !graph.IsGraphConstant(id)) {
        small.insert_or_assign(id, ConstantFromTyped((*out)[i].Owned()));
      }
      values.computed[id] = std::move((*out)[i]);
    }
  }
  std::vector<TypedTensor> outputs;
  for (ValueId id : graph.outputs()) {
    auto t = values.Typed(id);
    if (!t.ok() || *t == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("output '", graph.value(id).name, "' was not computed"));
    }
    outputs.push_back((*t)->Owned());  // constants are views
  }
  return outputs;
}

absl::StatusOr<std::vector<kernels::Tensor>> RunReference(
    const Graph& graph, const std::vector<kernels::Tensor>& inputs) {
  std::vector<TypedTensor> typed;
  for (const kernels::Tensor& t : inputs) typed.push_back(TypedTensor::FromFloat(t));
  auto out = RunReferenceTyped(graph, typed);
  if (!out.ok()) return out.status();
  std::vector<kernels::Tensor> outputs;
  for (const TypedTensor& t : *out) outputs.push_back(t.ToFloat());
  return outputs;
}

}  // namespace numaserve::engine
