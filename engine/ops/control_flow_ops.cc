// Op table rows for If and Loop. The importer (engine/import/control_flow.cc)
// inlines an If whose condition is known at load (its chosen branch) and
// unrolls a Loop whose trip count is known at load and whose condition
// stays true; neither op is left in a graph it returns. What remains after
// import is refused at load by these rows' validation, naming the node and
// the graph input its condition or trip count depends on.
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"

namespace numaserve::engine::ops {
namespace {

// The first graph input VALUE is computed from (depth first), or "" when
// it reads none (a value the importer could not fold for another reason).
std::string InputBehind(const Graph& graph, ValueId value) {
  absl::flat_hash_map<ValueId, const Node*> producer;
  for (const Node& n : graph.nodes()) {
    for (ValueId out : n.outputs) producer[out] = &n;
  }
  std::vector<ValueId> stack = {value};
  std::vector<bool> seen(graph.num_values(), false);
  while (!stack.empty()) {
    const ValueId v = stack.back();
    stack.pop_back();
    if (v == kNoValue || seen[v]) continue;
    seen[v] = true;
    for (ValueId in : graph.inputs()) {
      if (in == v) return graph.value(v).name;
    }
    const auto it = producer.find(v);
    if (it == producer.end()) continue;
    for (ValueId in : it->second->inputs) stack.push_back(in);
  }
  return "";
}

// "depends on input 'x'" or "is not known at load".
std::string Dependence(const Graph& graph, ValueId value) {
  const std::string input = InputBehind(graph, value);
  return input.empty() ? "is not known at load" : absl::StrCat("depends on input '", input, "'");
}

absl::Status IfValidate(const Graph& graph, const Node& node) {
  // Its inputs: the condition, then what its branches read from outside.
  if (!HasInput(node, 0)) return NodeError(node, "the condition (input 0) is required");
  if (graph.IsConstant(node.inputs[0])) {
    return NodeUnsupported(node, "its condition is known at load, but its branch was not inlined");
  }
  return NodeUnsupported(node, absl::StrCat("condition ", Dependence(graph, node.inputs[0]),
                                            "; only conditions known at load are supported"));
}

absl::Status LoopValidate(const Graph& graph, const Node& node) {
  if (node.inputs.empty() || !HasInput(node, 0)) {
    return NodeUnsupported(node,
                           "it has no trip count M (it runs until its condition ends it); only "
                           "loops whose trip count is known at load are supported");
  }
  if (!graph.IsConstant(node.inputs[0])) {
    return NodeUnsupported(node, absl::StrCat("trip count M ", Dependence(graph, node.inputs[0]),
                                              "; only trip counts known at load are supported"));
  }
  if (HasInput(node, 1) && !graph.IsConstant(node.inputs[1])) {
    return NodeUnsupported(node, absl::StrCat("condition ", Dependence(graph, node.inputs[1]),
                                              "; only loops whose condition is known at load "
                                              "are supported"));
  }
  return NodeUnsupported(node, "its trip count is known at load, but it was not unrolled");
}

absl::Status ControlFlowValidate(const Graph& graph, const Node& node) {
  return node.op_type == "If" ? IfValidate(graph, node) : LoopValidate(graph, node);
}

ShapesOr ControlFlowShapes(const Graph& graph, const Node& node, const std::vector<const Shape*>&) {
  return ControlFlowValidate(graph, node);
}

TensorsOr ControlFlowReference(const Graph& graph, const Node& node,
                               const std::vector<const Tensor*>&) {
  return ControlFlowValidate(graph, node);
}

}  // namespace

void AddControlFlowOps(std::vector<OpSchema>& table) {
  for (const char* op : {"If", "Loop"}) {
    table.push_back({op, ControlFlowValidate, ControlFlowShapes, ControlFlowReference, NoFlops});
  }
}

}  // namespace numaserve::engine::ops
