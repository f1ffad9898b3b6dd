// Reading ONNX protobuf pieces into the engine's Graph: tensors
// (initializers, tensor attributes), value infos and nodes. Used by
// onnx_import.cc for the main graph and by control_flow.cc for the
// subgraphs of If and Loop, whose names are renamed on the way in (a
// NameScope). Internal to engine/import.
#pragma once

#include <onnx/onnx_pb.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/ir/graph.h"

namespace numaserve::engine {

// Names as a subgraph's nodes see them and as the Graph holds them: a name
// the map holds becomes its value, any other stays as it is (the main
// graph's names); node names get `prefix` in front. The empty scope (the
// main graph) renames nothing.
struct NameScope {
  std::string prefix;
  std::shared_ptr<const absl::flat_hash_map<std::string, std::string>> names;

  std::string Map(const std::string& name) const {
    if (names == nullptr) return name;
    const auto it = names->find(name);
    return it == names->end() ? name : it->second;
  }
};

// A subgraph of an If (then_branch, else_branch) or a Loop (body), kept by
// reference to the model's protobuf, with the scope its node was read in
// (what the names it reads from outside resolve to).
struct Subgraph {
  const onnx::GraphProto* proto = nullptr;
  NameScope outer;
};

// The subgraphs of the If and Loop nodes read so far; the node's attribute
// of the subgraph's name holds its index here.
struct Subgraphs {
  std::vector<Subgraph> graphs;
  int64_t inlined_nodes = 0;  // nodes added by inlining them (control_flow.cc)
};

// The node attribute holding how many of an If's or Loop's inputs are
// there only because its subgraphs read them from the enclosing scope (its
// last inputs): they keep what they read alive until it is inlined.
inline constexpr char kImplicitInputs[] = "numaserve.implicit_inputs";

DataType FromOnnxType(int32_t t);
bool UsesExternalData(const onnx::TensorProto& t);

// An initializer or tensor attribute; its declared dims are checked against
// the bytes it holds before anything is allocated.
absl::StatusOr<Constant> ReadConstant(const onnx::TensorProto& t);

// Type, shape and dim names of a value info into VALUE.
void ReadValueInfo(const onnx::ValueInfoProto& info, Value& value);

// A node of a supported op, its names through SCOPE. The GRAPH attributes
// of an If or Loop are added to SUBGRAPHS (their index becomes the
// attribute) and what they read from the enclosing scope to its inputs
// (kImplicitInputs); any other op with a GRAPH attribute is refused.
absl::StatusOr<Node> ReadNode(const onnx::NodeProto& proto, int index, Graph& graph,
                              const NameScope& scope, Subgraphs& subgraphs);

// A Constant node becomes a graph constant (no runtime work).
absl::Status ReadConstantNode(const onnx::NodeProto& proto, Graph& graph, const NameScope& scope);

// The names a subgraph reads from its enclosing scope (its own and its
// nested subgraphs' reads that it does not define), sorted;
// INVALID_ARGUMENT when subgraphs nest deeper than 64.
absl::StatusOr<std::vector<std::string>> OuterNames(const onnx::GraphProto& g);

}  // namespace numaserve::engine
