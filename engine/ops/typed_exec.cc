#include "engine/ops/typed_exec.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/ops/op_registry.h"

namespace numaserve::engine {

DataType RuntimeType(const Graph& graph, ValueId id) {
  const DataType t = graph.value(id).type;
  return t == DataType::kUnknown ? DataType::kFloat32 : t;
}

bool NeedsTypedRun(const Graph& graph, const Node& node) {
  for (ValueId v : node.inputs) {
    if (v != kNoValue && !graph.IsConstant(v) && !graph.IsShapeParameter(v) &&
        RuntimeType(graph, v) != DataType::kFloat32) {
      return true;
    }
  }
  for (ValueId v : node.outputs) {
    if (RuntimeType(graph, v) != DataType::kFloat32) return true;
  }
  return false;
}

namespace {

DataType TypeOf(const Graph& graph, ValueId v) {
  if (v == kNoValue) return DataType::kUnknown;
  if (const Constant* c = graph.FindConstant(v); c != nullptr) return c->type;
  return RuntimeType(graph, v);
}

}  // namespace

absl::Status CheckTypedNode(const Graph& graph, const Node& node) {
  const OpSchema* schema = FindOpSchema(node.op_type);
  std::vector<DataType> in, out;
  for (ValueId v : node.inputs) in.push_back(TypeOf(graph, v));
  for (ValueId v : node.outputs) out.push_back(TypeOf(graph, v));
  if (schema == nullptr || schema->typed_accepts == nullptr) {
    // Name the first value that is not FP32.
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ValueId v = node.inputs[i];
      if (v != kNoValue && !graph.IsConstant(v) && !graph.IsShapeParameter(v) &&
          in[i] != DataType::kFloat32) {
        return absl::UnimplementedError(
            absl::StrCat(node.Describe(), ": input '", graph.value(v).name, "' is ",
                         DataTypeName(in[i]), "; ", node.op_type, " runs on FP32 only"));
      }
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      if (out[i] != DataType::kFloat32) {
        return absl::UnimplementedError(
            absl::StrCat(node.Describe(), ": output '", graph.value(node.outputs[i]).name, "' is ",
                         DataTypeName(out[i]), "; ", node.op_type, " runs on FP32 only"));
      }
    }
    return absl::OkStatus();
  }
  absl::Status s = schema->typed_accepts(node, in, out);
  if (s.ok()) return s;
  std::string types;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (node.inputs[i] == kNoValue) continue;
    absl::StrAppend(&types, types.empty() ? "" : ", ", "input '", graph.value(node.inputs[i]).name,
                    "' is ", DataTypeName(in[i]));
  }
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    absl::StrAppend(&types, ", output '", graph.value(node.outputs[i]).name, "' is ",
                    DataTypeName(out[i]));
  }
  return absl::UnimplementedError(absl::StrCat(s.message(), " (", types, ")"));
}

absl::StatusOr<TypedTensor> ConstantAsTyped(const Constant& c) {
  const int64_t n = kernels::NumElements(c.shape);
  // Views: a large table (an embedding) is not copied.
  if (c.type == DataType::kFloat32 && static_cast<int64_t>(c.f32.data.size()) == n) {
    return TypedTensor::View(DataType::kFloat32, c.shape, c.f32.data.data());
  }
  if (c.type != DataType::kUnknown && c.type != DataType::kFloat32 &&
      c.bytes.size() == n * DataTypeSize(c.type)) {
    return TypedTensor::View(c.type, c.shape, c.bytes.data());
  }
  return absl::UnimplementedError(
      absl::StrCat("a constant of type ", DataTypeName(c.type), " has no readable data"));
}

Constant ConstantFromTyped(TypedTensor t) {
  if (t.view != nullptr) t = t.Owned();
  Constant c;
  c.type = t.type;
  c.shape = t.shape;
  if (t.type == DataType::kFloat32) {
    c.f32 = t.ToFloat();
    return c;
  }
  c.f32 = t.ToFloat();
  if (IsIntegerType(t.type) || t.type == DataType::kBool) {
    c.i64.resize(t.size());
    for (int64_t i = 0; i < t.size(); ++i) c.i64[i] = t.GetInt64(i);
  }
  c.bytes = std::move(t.bytes);
  return c;
}

absl::StatusOr<std::vector<TypedTensor>> RunTypedNode(
    const Graph& graph, const Node& node, const std::vector<const TypedTensor*>& inputs) {
  const OpSchema* schema = FindOpSchema(node.op_type);
  if (schema == nullptr || schema->typed_reference == nullptr) {
    return absl::UnimplementedError(absl::StrCat(node.Describe(), " has no typed reference"));
  }
  auto out = schema->typed_reference(graph, node, inputs);
  if (!out.ok()) return out.status();
  if (out->size() < node.outputs.size()) {
    return absl::InternalError(absl::StrCat(node.Describe(), ": the typed reference gave ",
                                            out->size(), " outputs for ", node.outputs.size()));
  }
  for (size_t j = 0; j < node.outputs.size(); ++j) {
    if ((*out)[j].view != nullptr) (*out)[j] = (*out)[j].Owned();  // an input passed through
    const DataType want = graph.value(node.outputs[j]).type;
    if (want != DataType::kUnknown && (*out)[j].type != want) (*out)[j] = (*out)[j].CastTo(want);
  }
  return out;
}

}  // namespace numaserve::engine
