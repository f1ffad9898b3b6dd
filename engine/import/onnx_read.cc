#include "engine/import/onnx_read.h"

#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/typed_exec.h"
#include "kernels/tensor.h"

namespace numaserve::engine {
namespace {

// Copies a repeated field (one entry per element, converted to T) or
// little-endian raw_data into `out`. The declared count (at most
// kMaxTensorElements, so count * sizeof(T) fits) is checked against the
// bytes or values actually present before anything is allocated: a tensor
// claiming 2^40 elements with 16 bytes of data is an error, not an
// allocation.
template <typename T, typename Repeated>
absl::Status ReadElements(const onnx::TensorProto& t, const Repeated& field, int64_t count,
                          std::vector<uint8_t>& out) {
  const uint64_t expected = static_cast<uint64_t>(count) * sizeof(T);
  if (!t.raw_data().empty()) {
    if (t.raw_data().size() != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "initializer '", t.name(), "' declares dims [", absl::StrJoin(t.dims(), ","), "] (",
          count, " elements, ", expected, " bytes) but holds ", t.raw_data().size(), " raw bytes"));
    }
    out.resize(expected);
    std::memcpy(out.data(), t.raw_data().data(), t.raw_data().size());
    return absl::OkStatus();
  }
  if (static_cast<int64_t>(field.size()) != count) {
    return absl::InvalidArgumentError(
        absl::StrCat("initializer '", t.name(), "' declares dims [", absl::StrJoin(t.dims(), ","),
                     "] (", count, " elements) but holds ", field.size(), " values"));
  }
  out.resize(expected);
  T* dst = reinterpret_cast<T*>(out.data());
  for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<T>(field.Get(i));
  return absl::OkStatus();
}

}  // namespace

DataType FromOnnxType(int32_t t) {
  switch (t) {
    case onnx::TensorProto::BOOL:
      return DataType::kBool;
    case onnx::TensorProto::UINT8:
      return DataType::kUint8;
    case onnx::TensorProto::INT8:
      return DataType::kInt8;
    case onnx::TensorProto::UINT16:
      return DataType::kUint16;
    case onnx::TensorProto::INT16:
      return DataType::kInt16;
    case onnx::TensorProto::INT32:
      return DataType::kInt32;
    case onnx::TensorProto::UINT32:
      return DataType::kUint32;
    case onnx::TensorProto::INT64:
      return DataType::kInt64;
    case onnx::TensorProto::UINT64:
      return DataType::kUint64;
    case onnx::TensorProto::FLOAT16:
      return DataType::kFloat16;
    case onnx::TensorProto::BFLOAT16:
      return DataType::kBFloat16;
    case onnx::TensorProto::FLOAT:
      return DataType::kFloat32;
    case onnx::TensorProto::DOUBLE:
      return DataType::kFloat64;
    default:
      return DataType::kUnknown;  // STRING, complex, FP8, ...
  }
}

bool UsesExternalData(const onnx::TensorProto& t) {
  return t.data_location() == onnx::TensorProto::EXTERNAL || t.external_data_size() > 0;
}

absl::StatusOr<Constant> ReadConstant(const onnx::TensorProto& t) {
  // External data would be a path the model names: never followed.
  if (UsesExternalData(t)) {
    return absl::UnimplementedError(
        absl::StrCat("initializer '", t.name(), "' uses external data, which is not supported"));
  }
  if (t.has_segment()) {
    return absl::UnimplementedError(
        absl::StrCat("initializer '", t.name(), "' is segmented, which is not supported"));
  }
  Constant c;
  c.type = FromOnnxType(t.data_type());
  c.shape.assign(t.dims().begin(), t.dims().end());
  auto checked = kernels::NumElementsChecked(c.shape);
  if (!checked.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("initializer '", t.name(), "': ", checked.status().message()));
  }
  const int64_t count = *checked;
  std::vector<uint8_t> bytes;
  absl::Status status;
  switch (t.data_type()) {
    case onnx::TensorProto::FLOAT:
      status = ReadElements<float>(t, t.float_data(), count, bytes);
      break;
    case onnx::TensorProto::DOUBLE:
      status = ReadElements<double>(t, t.double_data(), count, bytes);
      break;
    case onnx::TensorProto::INT64:
      status = ReadElements<int64_t>(t, t.int64_data(), count, bytes);
      break;
    case onnx::TensorProto::UINT64:
      status = ReadElements<uint64_t>(t, t.uint64_data(), count, bytes);
      break;
    case onnx::TensorProto::UINT32:
      status = ReadElements<uint32_t>(t, t.uint64_data(), count, bytes);
      break;
    case onnx::TensorProto::INT32:
      status = ReadElements<int32_t>(t, t.int32_data(), count, bytes);
      break;
    case onnx::TensorProto::INT16:
      status = ReadElements<int16_t>(t, t.int32_data(), count, bytes);
      break;
    case onnx::TensorProto::UINT16:
    case onnx::TensorProto::FLOAT16:
    case onnx::TensorProto::BFLOAT16:
      // FP16/BF16 bits are stored in int32_data.
      status = ReadElements<uint16_t>(t, t.int32_data(), count, bytes);
      break;
    case onnx::TensorProto::INT8:
      status = ReadElements<int8_t>(t, t.int32_data(), count, bytes);
      break;
    case onnx::TensorProto::UINT8:
      status = ReadElements<uint8_t>(t, t.int32_data(), count, bytes);
      break;
    case onnx::TensorProto::BOOL:
      status = ReadElements<uint8_t>(t, t.int32_data(), count, bytes);
      for (uint8_t& b : bytes) b = b != 0;
      break;
    default:
      return c;  // kept as type + shape; ops that need the data reject it
  }
  if (!status.ok()) return status;
  if (c.type == DataType::kFloat32) {
    c.f32.shape = c.shape;
    c.f32.data.resize(count);
    if (count > 0) std::memcpy(c.f32.data.data(), bytes.data(), count * sizeof(float));
    return c;
  }
  // Non-FP32 constants keep their exact elements and also get an FP32 copy
  // (the FP32 references read every operand as FP32); integer and boolean
  // ones their values as int64 for shape arithmetic.
  return ConstantFromTyped(TypedTensor::FromBytes(c.type, c.shape, bytes.data()));
}

void ReadValueInfo(const onnx::ValueInfoProto& info, Value& value) {
  if (!info.type().has_tensor_type()) return;
  const auto& tt = info.type().tensor_type();
  value.type = FromOnnxType(tt.elem_type());
  if (!tt.has_shape()) return;
  value.has_shape = true;
  value.shape.clear();
  value.dim_names.clear();
  for (const auto& dim : tt.shape().dim()) {
    const bool fixed = dim.has_dim_value() && dim.dim_value() >= 0;
    value.shape.push_back(fixed ? dim.dim_value() : -1);
    value.dim_names.push_back(!fixed && dim.has_dim_param() ? dim.dim_param() : std::string());
  }
}

namespace {

// GRAPH attributes: an If's branches, a Loop's body. Kept in SUBGRAPHS,
// the attribute holding its index there.
absl::Status ReadSubgraphAttribute(const onnx::AttributeProto& a, const NameScope& scope,
                                   Subgraphs& subgraphs, Node& node) {
  const bool expected =
      (node.op_type == "If" && (a.name() == "then_branch" || a.name() == "else_branch")) ||
      (node.op_type == "Loop" && a.name() == "body");
  if (!expected) {
    return absl::UnimplementedError(
        absl::StrCat(node.Describe(), ": attribute '", a.name(), "' has an unsupported kind"));
  }
  node.attributes[a.name()] = static_cast<int64_t>(subgraphs.graphs.size());
  subgraphs.graphs.push_back(Subgraph{.proto = &a.g(), .outer = scope});
  return absl::OkStatus();
}

absl::Status ReadAttribute(const onnx::AttributeProto& a, const NameScope& scope,
                           Subgraphs& subgraphs, Node& node) {
  switch (a.type()) {
    case onnx::AttributeProto::INT:
      node.attributes[a.name()] = static_cast<int64_t>(a.i());
      return absl::OkStatus();
    case onnx::AttributeProto::FLOAT:
      node.attributes[a.name()] = a.f();
      return absl::OkStatus();
    case onnx::AttributeProto::STRING:
      node.attributes[a.name()] = a.s();
      return absl::OkStatus();
    case onnx::AttributeProto::INTS:
      node.attributes[a.name()] = std::vector<int64_t>(a.ints().begin(), a.ints().end());
      return absl::OkStatus();
    case onnx::AttributeProto::FLOATS:
      node.attributes[a.name()] = std::vector<float>(a.floats().begin(), a.floats().end());
      return absl::OkStatus();
    case onnx::AttributeProto::STRINGS:
      // Kept comma-joined (LSTM's and GRU's activations: names without
      // commas); a string holding a comma is refused.
      for (const std::string& s : a.strings()) {
        if (s.find(',') != std::string::npos) {
          return absl::UnimplementedError(absl::StrCat(node.Describe(), ": attribute '", a.name(),
                                                       "' holds a string with a comma"));
        }
      }
      node.attributes[a.name()] = absl::StrJoin(a.strings(), ",");
      return absl::OkStatus();
    case onnx::AttributeProto::TENSOR: {
      // A small tensor attribute (ConstantOfShape's value): exact, and as
      // FP32 for the FP32 references.
      auto c = ReadConstant(a.t());
      if (!c.ok()) {
        return absl::Status(c.status().code(), absl::StrCat(node.Describe(), ": attribute '",
                                                            a.name(), "': ", c.status().message()));
      }
      if (static_cast<int64_t>(c->f32.data.size()) != kernels::NumElements(c->shape)) {
        return absl::UnimplementedError(absl::StrCat(node.Describe(), ": tensor attribute '",
                                                     a.name(), "' has an unsupported type"));
      }
      node.attributes[a.name()] = c->f32.data;
      node.tensor_attributes[a.name()] = *std::move(c);
      return absl::OkStatus();
    }
    case onnx::AttributeProto::GRAPH:
      return ReadSubgraphAttribute(a, scope, subgraphs, node);
    default:
      return absl::UnimplementedError(
          absl::StrCat(node.Describe(), ": attribute '", a.name(), "' has an unsupported kind"));
  }
}

// What an If's or Loop's subgraphs read from the enclosing scope becomes
// its last inputs (kImplicitInputs counts them).
absl::Status AddImplicitInputs(const onnx::NodeProto& proto, const NameScope& scope, Graph& graph,
                               Node& node) {
  std::set<std::string> outer;
  for (const onnx::AttributeProto& a : proto.attribute()) {
    if (a.type() != onnx::AttributeProto::GRAPH) continue;
    auto names = OuterNames(a.g());
    if (!names.ok()) return names.status();
    outer.insert(names->begin(), names->end());
  }
  for (const std::string& name : outer) {
    const auto id = graph.FindValue(scope.Map(name));
    if (!id.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(node.Describe(), ": a subgraph reads '", name, "', which is not defined"));
    }
    node.inputs.push_back(*id);
  }
  node.attributes[kImplicitInputs] = static_cast<int64_t>(outer.size());
  return absl::OkStatus();
}

// The names G defines: its inputs, initializers and node outputs.
void DefinedNames(const onnx::GraphProto& g, std::set<std::string>& out) {
  for (const auto& v : g.input()) out.insert(v.name());
  for (const auto& t : g.initializer()) out.insert(t.name());
  for (const auto& n : g.node()) {
    for (const std::string& o : n.output()) out.insert(o);
  }
}

absl::Status OuterNamesOf(const onnx::GraphProto& g, int depth, std::set<std::string>& out) {
  constexpr int kMaxDepth = 64;  // nesting a hostile file may build
  if (depth > kMaxDepth) return absl::InvalidArgumentError("subgraphs nested too deep");
  std::set<std::string> defined, read;
  DefinedNames(g, defined);
  for (const auto& n : g.node()) {
    for (const std::string& in : n.input()) {
      if (!in.empty()) read.insert(in);
    }
    for (const auto& a : n.attribute()) {
      if (a.type() != onnx::AttributeProto::GRAPH) continue;
      if (absl::Status s = OuterNamesOf(a.g(), depth + 1, read); !s.ok()) return s;
    }
  }
  for (const auto& v : g.output()) read.insert(v.name());
  for (const std::string& name : read) {
    if (!defined.contains(name)) out.insert(name);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> OuterNames(const onnx::GraphProto& g) {
  std::set<std::string> out;
  if (absl::Status s = OuterNamesOf(g, 0, out); !s.ok()) return s;
  return std::vector<std::string>(out.begin(), out.end());
}

absl::StatusOr<Node> ReadNode(const onnx::NodeProto& proto, int index, Graph& graph,
                              const NameScope& scope, Subgraphs& subgraphs) {
  Node node;
  node.op_type = proto.op_type();
  node.name =
      absl::StrCat(scope.prefix,
                   proto.name().empty() ? absl::StrCat(proto.op_type(), "_", index) : proto.name());
  const bool default_domain = proto.domain().empty() || proto.domain() == "ai.onnx";
  if (!default_domain || FindOpSchema(node.op_type) == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat(node.Describe(), " is not supported (supported: ", SupportedOpsList(), ")"));
  }
  for (const std::string& in : proto.input()) {
    node.inputs.push_back(in.empty() ? kNoValue : graph.GetOrAddValue(scope.Map(in)));
  }
  // Trailing omitted optional outputs ("") are dropped.
  int num_outputs = proto.output_size();
  while (num_outputs > 0 && proto.output(num_outputs - 1).empty()) --num_outputs;
  for (int i = 0; i < num_outputs; ++i) {
    if (proto.output(i).empty()) {
      return absl::UnimplementedError(
          absl::StrCat(node.Describe(), ": an omitted output before a present one"));
    }
    node.outputs.push_back(graph.GetOrAddValue(scope.Map(proto.output(i))));
  }
  for (const onnx::AttributeProto& a : proto.attribute()) {
    if (absl::Status s = ReadAttribute(a, scope, subgraphs, node); !s.ok()) return s;
  }
  if (node.op_type == "If" || node.op_type == "Loop") {
    if (absl::Status s = AddImplicitInputs(proto, scope, graph, node); !s.ok()) return s;
  }
  return node;
}

namespace {

// Constant's attribute as a tensor: `value` as it is, the scalar and list
// forms (value_float(s), value_int(s)) as the 0-D or 1-D tensor they mean.
absl::StatusOr<onnx::TensorProto> ConstantTensor(const onnx::AttributeProto& a) {
  onnx::TensorProto t;
  if (a.name() == "value" && a.has_t()) return a.t();
  if (a.name() == "value_float" && a.type() == onnx::AttributeProto::FLOAT) {
    t.set_data_type(onnx::TensorProto::FLOAT);
    t.add_float_data(a.f());
  } else if (a.name() == "value_floats" && a.type() == onnx::AttributeProto::FLOATS) {
    t.set_data_type(onnx::TensorProto::FLOAT);
    t.add_dims(a.floats_size());
    *t.mutable_float_data() = a.floats();
  } else if (a.name() == "value_int" && a.type() == onnx::AttributeProto::INT) {
    t.set_data_type(onnx::TensorProto::INT64);
    t.add_int64_data(a.i());
  } else if (a.name() == "value_ints" && a.type() == onnx::AttributeProto::INTS) {
    t.set_data_type(onnx::TensorProto::INT64);
    t.add_dims(a.ints_size());
    *t.mutable_int64_data() = a.ints();
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "attribute '", absl::CHexEscape(a.name()),
        "' is not supported (supported: value, value_float, value_floats, value_int, value_ints)"));
  }
  return t;
}

}  // namespace

absl::Status ReadConstantNode(const onnx::NodeProto& proto, Graph& graph, const NameScope& scope) {
  const std::string name = absl::StrCat(scope.prefix, proto.name());
  if (proto.output_size() != 1 || proto.attribute_size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node '", name, "' (op Constant): needs one output and exactly one value attribute"));
  }
  auto tensor = ConstantTensor(proto.attribute(0));
  if (!tensor.ok()) {
    return absl::Status(
        tensor.status().code(),
        absl::StrCat("node '", name, "' (op Constant): ", tensor.status().message()));
  }
  auto c = ReadConstant(*tensor);
  if (!c.ok()) {
    return absl::Status(c.status().code(),
                        absl::StrCat("node '", name, "' (op Constant): ", c.status().message()));
  }
  const ValueId id = graph.GetOrAddValue(scope.Map(proto.output(0)));
  graph.value(id).type = c->type;
  graph.value(id).shape = c->shape;
  graph.value(id).has_shape = true;
  graph.SetConstant(id, *std::move(c));
  return absl::OkStatus();
}

}  // namespace numaserve::engine
