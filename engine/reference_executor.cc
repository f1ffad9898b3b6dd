#include "engine/reference_executor.h"

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/op_registry.h"
#include "engine/typed_exec.h"

namespace numaserve::engine {

absl::StatusOr<std::vector<TypedTensor>> RunReferenceTyped(const Graph& graph,
                                                           const std::vector<TypedTensor>& inputs) {
  if (inputs.size() != graph.inputs().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", graph.inputs().size(), " inputs, got ", inputs.size()));
  }
  std::vector<std::optional<TypedTensor>> computed(graph.num_values());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ValueId id = graph.inputs()[i];
    if (inputs[i].type != RuntimeType(graph, id)) {
      return absl::InvalidArgumentError(absl::StrCat("input '", graph.value(id).name, "' is ",
                                                     DataTypeName(inputs[i].type), ", expected ",
                                                     DataTypeName(RuntimeType(graph, id))));
    }
    computed[id] = inputs[i];
  }
  // Constants read as typed tensors, converted once.
  std::vector<std::optional<TypedTensor>> constants(graph.num_values());
  auto typed = [&](ValueId id) -> absl::StatusOr<const TypedTensor*> {
    if (id == kNoValue) return nullptr;
    if (computed[id].has_value()) return &*computed[id];
    const Constant* c = graph.FindConstant(id);
    if (c == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("value '", graph.value(id).name, "' is read before it is computed"));
    }
    if (!constants[id].has_value()) {
      auto t = ConstantAsTyped(*c);
      if (!t.ok()) return t.status();
      constants[id] = *std::move(t);
    }
    return &*constants[id];
  };
  for (const Node& node : graph.nodes()) {
    const OpSchema* schema = FindOpSchema(node.op_type);
    if (schema == nullptr) {
      return absl::UnimplementedError(absl::StrCat(node.Describe(), " is not supported"));
    }
    if (node.inputs.empty() || node.inputs[0] == kNoValue) {
      return absl::InvalidArgumentError(absl::StrCat(node.Describe(), ": first input missing"));
    }
    std::vector<TypedTensor> out;
    if (NeedsTypedRun(graph, node)) {
      std::vector<const TypedTensor*> in;
      for (ValueId id : node.inputs) {
        auto t = typed(id);
        if (!t.ok()) return t.status();
        in.push_back(*t);
      }
      auto r = RunTypedNode(graph, node, in);
      if (!r.ok()) return r.status();
      out = *std::move(r);
    } else {
      // FP32 values; constants (of any type) through their FP32 copy.
      std::vector<kernels::Tensor> held(node.inputs.size());
      std::vector<const kernels::Tensor*> in;
      for (size_t i = 0; i < node.inputs.size(); ++i) {
        const ValueId id = node.inputs[i];
        if (id == kNoValue) {
          in.push_back(nullptr);
        } else if (computed[id].has_value()) {
          held[i] = computed[id]->ToFloat();
          in.push_back(&held[i]);
        } else if (const Constant* c = graph.FindConstant(id);
                   c != nullptr && c->f32.shape == c->shape &&
                   static_cast<int64_t>(c->f32.data.size()) == kernels::NumElements(c->shape)) {
          in.push_back(&c->f32);
        } else {
          // A constant without a whole FP32 copy converts from its typed
          // value; a value nothing computed is an error (never a null input
          // to an op's reference).
          auto t = typed(id);
          if (!t.ok()) return t.status();
          held[i] = (*t)->ToFloat();
          in.push_back(&held[i]);
        }
      }
      if (in[0] == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(node.Describe(), ": first input missing"));
      }
      auto r = schema->reference(graph, node, in);
      if (!r.ok()) return r.status();
      for (kernels::Tensor& t : *r) out.push_back(TypedTensor::FromFloat(t));
    }
    for (size_t i = 0; i < node.outputs.size() && i < out.size(); ++i) {
      computed[node.outputs[i]] = std::move(out[i]);
    }
  }
  std::vector<TypedTensor> outputs;
  for (ValueId id : graph.outputs()) {
    auto t = typed(id);
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
