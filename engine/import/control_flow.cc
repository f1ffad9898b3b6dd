#include "engine/import/control_flow.h"

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/import/constant_folding.h"
#include "engine/ir/typed_tensor.h"
#include "engine/ops/op_util.h"
#include "engine/ops/typed_exec.h"

namespace numaserve::engine {
namespace {

using NameMap = absl::flat_hash_map<std::string, std::string>;
using ops::HasInput;
using ops::NodeError;
using ops::NodeUnsupported;

// Reads subgraphs into the nodes that replace an If or a Loop.
class Inliner {
 public:
  Inliner(Graph& graph, Subgraphs& subgraphs, std::vector<Node>& out)
      : graph_(graph), subgraphs_(subgraphs), out_(out) {}

  absl::Status InlineIf(const Node& node);
  absl::Status UnrollLoop(const Node& node, std::vector<LoopCondition>& conditions);

 private:
  // The subgraph the node's attribute ATTR names.
  absl::StatusOr<Subgraph> SubgraphOf(const Node& node, const std::string& attr) const;
  // COUNT more nodes within kMaxInlinedNodes, taken; else UNIMPLEMENTED
  // naming the node and WHAT would add them.
  absl::Status Take(const Node& node, double count, const std::string& what);
  // The outer scope's names, and the names G defines (initializers, node
  // outputs) with PREFIX, each new to the graph.
  absl::StatusOr<std::shared_ptr<NameMap>> LocalNames(const Node& node, const onnx::GraphProto& g,
                                                      const NameScope& outer,
                                                      const std::string& prefix) const;
  // G's initializers, value infos and nodes, their names through SCOPE.
  absl::Status ReadBody(const onnx::GraphProto& g, const NameScope& scope);
  // A node of OP from FROM to TO (names of values that exist).
  absl::Status Emit(const std::string& name, const std::string& op,
                    const std::vector<std::string>& from, const std::string& to,
                    std::map<std::string, AttributeValue> attributes = {});
  // A scalar (or [1] where the body declares rank 1) constant named NAME.
  void AddConstant(const std::string& name, DataType type, int64_t value,
                   const onnx::ValueInfoProto& declared);
  absl::Status StackScans(const Node& node, const std::vector<std::vector<std::string>>& scans,
                          size_t first_output);

  Graph& graph_;
  Subgraphs& subgraphs_;
  std::vector<Node>& out_;
};

absl::StatusOr<Subgraph> Inliner::SubgraphOf(const Node& node, const std::string& attr) const {
  const int64_t index = node.GetInt(attr, -1);
  if (index < 0 || index >= static_cast<int64_t>(subgraphs_.graphs.size())) {
    return NodeError(node, absl::StrCat("attribute '", attr, "' (a graph) is required"));
  }
  return subgraphs_.graphs[index];  // a copy: reading nodes may add subgraphs
}

absl::Status Inliner::Take(const Node& node, double count, const std::string& what) {
  const double total = static_cast<double>(subgraphs_.inlined_nodes) + count;
  if (total > static_cast<double>(kMaxInlinedNodes)) {
    return NodeUnsupported(
        node, absl::StrCat(what, " would bring the nodes that If and Loop add to the model to ",
                           total, ", above the limit of ", kMaxInlinedNodes));
  }
  subgraphs_.inlined_nodes += static_cast<int64_t>(count);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<NameMap>> Inliner::LocalNames(const Node& node,
                                                             const onnx::GraphProto& g,
                                                             const NameScope& outer,
                                                             const std::string& prefix) const {
  auto names = outer.names != nullptr ? std::make_shared<NameMap>(*outer.names)
                                      : std::make_shared<NameMap>();
  std::vector<std::string> defined;
  for (const auto& t : g.initializer()) defined.push_back(t.name());
  for (const auto& v : g.input()) defined.push_back(v.name());
  for (const auto& n : g.node()) {
    for (const std::string& o : n.output()) {
      if (!o.empty()) defined.push_back(o);
    }
  }
  for (const std::string& name : defined) {
    std::string renamed = absl::StrCat(prefix, name);
    if (graph_.FindValue(renamed).has_value()) {
      return NodeUnsupported(
          node, absl::StrCat("its subgraph's value '", name, "' would be named '", renamed,
                             "', which the model already uses"));
    }
    (*names)[name] = std::move(renamed);
  }
  return names;
}

absl::Status Inliner::ReadBody(const onnx::GraphProto& g, const NameScope& scope) {
  for (const onnx::TensorProto& t : g.initializer()) {
    auto c = ReadConstant(t);
    if (!c.ok()) return c.status();
    const ValueId id = graph_.GetOrAddValue(scope.Map(t.name()));
    graph_.value(id).type = c->type;
    graph_.value(id).shape = c->shape;
    graph_.value(id).has_shape = true;
    graph_.SetConstant(id, *std::move(c));
  }
  // Types and shapes ONNX inferred inside the subgraph, for its own values
  // only (the If's outputs keep what the enclosing graph says of them).
  for (const auto* infos : {&g.value_info(), &g.output()}) {
    for (const onnx::ValueInfoProto& vi : *infos) {
      const std::string name = scope.Map(vi.name());
      if (absl::StartsWith(name, scope.prefix))
        ReadValueInfo(vi, graph_.value(graph_.GetOrAddValue(name)));
    }
  }
  int index = 0;
  for (const onnx::NodeProto& proto : g.node()) {
    if (proto.op_type() == "Constant" && (proto.domain().empty() || proto.domain() == "ai.onnx")) {
      if (absl::Status s = ReadConstantNode(proto, graph_, scope); !s.ok()) return s;
    } else {
      auto node = ReadNode(proto, index, graph_, scope, subgraphs_);
      if (!node.ok()) return node.status();
      out_.push_back(*std::move(node));
    }
    ++index;
  }
  return absl::OkStatus();
}

absl::Status Inliner::Emit(const std::string& name, const std::string& op,
                           const std::vector<std::string>& from, const std::string& to,
                           std::map<std::string, AttributeValue> attributes) {
  Node n;
  n.name = name;
  n.op_type = op;
  n.attributes = std::move(attributes);
  for (const std::string& f : from) {
    const auto id = graph_.FindValue(f);
    if (!id.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("node '", name, "' (op ", op, "): '", f, "' is not defined"));
    }
    n.inputs.push_back(*id);
  }
  const ValueId out = graph_.GetOrAddValue(to);
  if (graph_.value(out).type == DataType::kUnknown && !n.inputs.empty()) {
    graph_.value(out).type = graph_.value(n.inputs[0]).type;
  }
  n.outputs.push_back(out);
  out_.push_back(std::move(n));
  return absl::OkStatus();
}

void Inliner::AddConstant(const std::string& name, DataType type, int64_t value,
                          const onnx::ValueInfoProto& declared) {
  const bool rank1 = declared.type().tensor_type().has_shape() &&
                     declared.type().tensor_type().shape().dim_size() == 1;
  Shape shape;
  if (rank1) shape.push_back(1);
  TypedTensor t = type == DataType::kBool
                      ? TypedTensor::FromValues(type, shape, std::vector<uint8_t>{value != 0})
                      : TypedTensor::FromValues(type, shape, std::vector<int64_t>{value});
  const ValueId id = graph_.GetOrAddValue(name);
  graph_.value(id).type = type;
  graph_.value(id).shape = std::move(shape);
  graph_.value(id).has_shape = true;
  graph_.SetConstant(id, ConstantFromTyped(std::move(t)));
}

// The one value of a constant (its first element: the caller checks the
// count).
int64_t ScalarOf(const Constant& c) {
  if (!c.i64.empty()) return c.i64[0];
  return c.f32.data.empty() ? 0 : static_cast<int64_t>(c.f32.data[0] != 0.0F);
}

absl::Status Inliner::InlineIf(const Node& node) {
  const Constant& cond = *graph_.FindConstant(node.inputs[0]);
  if (kernels::NumElements(cond.shape) != 1) {
    return NodeError(node, "its condition must hold one value");
  }
  const bool taken = ScalarOf(cond) != 0;
  auto sub = SubgraphOf(node, taken ? "then_branch" : "else_branch");
  if (!sub.ok()) return sub.status();
  const onnx::GraphProto& g = *sub->proto;
  if (g.output_size() < static_cast<int>(node.outputs.size())) {
    return NodeError(node, absl::StrCat("its branch has ", g.output_size(), " outputs, the If ",
                                        node.outputs.size()));
  }
  const std::string prefix = absl::StrCat(node.name, taken ? "/then/" : "/else/");
  if (absl::Status s = Take(node, g.node_size() + node.outputs.size(), "inlining its branch");
      !s.ok()) {
    return s;
  }
  auto names = LocalNames(node, g, sub->outer, prefix);
  if (!names.ok()) return names.status();
  // A branch output computed by a node of the branch is written under the
  // If's output's name; any other (a constant, an outer value, an output
  // named twice) is copied to it.
  std::set<std::string> computed;
  for (const auto& n : g.node()) {
    if (n.op_type() == "Constant") continue;
    for (const std::string& o : n.output()) computed.insert(o);
  }
  std::vector<size_t> copied;
  for (size_t k = 0; k < node.outputs.size(); ++k) {
    const std::string& o = g.output(static_cast<int>(k)).name();
    if (computed.erase(o) != 0) {
      (**names)[o] = graph_.value(node.outputs[k]).name;
    } else {
      copied.push_back(k);
    }
  }
  const NameScope scope{.prefix = prefix, .names = *names};
  if (absl::Status s = ReadBody(g, scope); !s.ok()) return s;
  for (size_t k : copied) {
    if (absl::Status s = Emit(absl::StrCat(prefix, "output_", k), "Identity",
                              {scope.Map(g.output(static_cast<int>(k)).name())},
                              graph_.value(node.outputs[k]).name);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// A Loop's trip count: M, or 0 where its condition input is a constant
// false.
absl::StatusOr<int64_t> TripsOf(const Graph& graph, const Node& node) {
  const Constant& m = *graph.FindConstant(node.inputs[0]);
  if (kernels::NumElements(m.shape) != 1 || m.i64.empty()) {
    return NodeError(node, "its trip count M must be one integer");
  }
  if (m.i64[0] < 0) return NodeError(node, absl::StrCat("its trip count M is ", m.i64[0]));
  if (HasInput(node, 1)) {
    const Constant& cond = *graph.FindConstant(node.inputs[1]);
    if (kernels::NumElements(cond.shape) != 1) {
      return NodeError(node, "its condition must hold one value");
    }
    if (ScalarOf(cond) == 0) return 0;
  }
  return m.i64[0];
}

absl::Status Inliner::StackScans(const Node& node,
                                 const std::vector<std::vector<std::string>>& scans,
                                 size_t first_output) {
  std::map<std::string, AttributeValue> axes;
  std::string axes_input;
  if (graph_.opset() >= 13) {
    axes_input = absl::StrCat(node.name, "/axes");
    const ValueId id = graph_.GetOrAddValue(axes_input);
    graph_.value(id).type = DataType::kInt64;
    graph_.value(id).shape = {1};
    graph_.value(id).has_shape = true;
    graph_.SetConstant(id, ConstantFromTyped(TypedTensor::FromValues(DataType::kInt64, Shape{1},
                                                                     std::vector<int64_t>{0})));
  } else {
    axes["axes"] = std::vector<int64_t>{0};
  }
  for (size_t k = 0; k < scans.size() && first_output + k < node.outputs.size(); ++k) {
    std::vector<std::string> stacked;
    for (size_t it = 0; it < scans[k].size(); ++it) {
      const std::string name = absl::StrCat(node.name, "/scan", k, "/", it);
      std::vector<std::string> from = {scans[k][it]};
      if (!axes_input.empty()) from.push_back(axes_input);
      if (absl::Status s = Emit(name, "Unsqueeze", from, name, axes); !s.ok()) return s;
      stacked.push_back(name);
    }
    if (absl::Status s =
            Emit(absl::StrCat(node.name, "/scan", k), "Concat", stacked,
                 graph_.value(node.outputs[first_output + k]).name, {{"axis", int64_t{0}}});
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Inliner::UnrollLoop(const Node& node, std::vector<LoopCondition>& conditions) {
  auto trips = TripsOf(graph_, node);
  if (!trips.ok()) return trips.status();
  auto sub = SubgraphOf(node, "body");
  if (!sub.ok()) return sub.status();
  const onnx::GraphProto& g = *sub->proto;
  const int64_t implicit = node.GetInt(kImplicitInputs, 0);
  const int64_t carried_count = static_cast<int64_t>(node.inputs.size()) - implicit - 2;
  const int64_t scan_count = g.output_size() - 1 - carried_count;
  if (carried_count < 0 || g.input_size() != 2 + carried_count || scan_count < 0 ||
      static_cast<int64_t>(node.outputs.size()) > carried_count + scan_count) {
    return NodeError(node, "its body's inputs and outputs do not match its own");
  }
  if (*trips == 0 && static_cast<int64_t>(node.outputs.size()) > carried_count) {
    return NodeUnsupported(node, "scan outputs of a loop that runs no iteration");
  }
  const double added = static_cast<double>(*trips) * (g.node_size() + scan_count) +
                       static_cast<double>(carried_count + scan_count);
  if (absl::Status s =
          Take(node, added,
               absl::StrCat("unrolling its ", *trips, " iterations of ", g.node_size(), " nodes"));
      !s.ok()) {
    return s;
  }
  std::vector<std::string> carried;
  for (int64_t j = 0; j < carried_count; ++j) {
    if (!HasInput(node, 2 + j)) return NodeError(node, "a loop-carried input is omitted");
    carried.push_back(graph_.value(node.inputs[2 + j]).name);
  }
  std::vector<std::vector<std::string>> scans(scan_count);
  for (int64_t it = 0; it < *trips; ++it) {
    const std::string prefix = absl::StrCat(node.name, "/", it, "/");
    auto names = LocalNames(node, g, sub->outer, prefix);
    if (!names.ok()) return names.status();
    AddConstant((**names)[g.input(0).name()], DataType::kInt64, it, g.input(0));
    AddConstant((**names)[g.input(1).name()], DataType::kBool, 1, g.input(1));
    for (int64_t j = 0; j < carried_count; ++j) (**names)[g.input(2 + j).name()] = carried[j];
    const NameScope scope{.prefix = prefix, .names = *names};
    if (absl::Status s = ReadBody(g, scope); !s.ok()) return s;
    if (it + 1 < *trips) conditions.push_back({node.Describe(), it, scope.Map(g.output(0).name())});
    for (int64_t j = 0; j < carried_count; ++j) carried[j] = scope.Map(g.output(1 + j).name());
    for (int64_t k = 0; k < scan_count; ++k) {
      scans[k].push_back(scope.Map(g.output(1 + carried_count + k).name()));
    }
  }
  for (int64_t j = 0; j < carried_count && j < static_cast<int64_t>(node.outputs.size()); ++j) {
    if (absl::Status s = Emit(absl::StrCat(node.name, "/output_", j), "Identity", {carried[j]},
                              graph_.value(node.outputs[j]).name);
        !s.ok()) {
      return s;
    }
  }
  return StackScans(node, scans, carried_count);
}

bool LoopDecided(const Graph& graph, const Node& node) {
  return HasInput(node, 0) && graph.IsConstant(node.inputs[0]) &&
         (!HasInput(node, 1) || graph.IsConstant(node.inputs[1]));
}

}  // namespace

absl::StatusOr<bool> InlineControlFlow(Graph& graph, Subgraphs& subgraphs,
                                       std::vector<LoopCondition>& conditions) {
  std::vector<Node> out;
  Inliner inliner(graph, subgraphs, out);
  bool changed = false;
  for (Node& node : graph.nodes()) {
    if (node.op_type == "If" && HasInput(node, 0) && graph.IsConstant(node.inputs[0])) {
      if (absl::Status s = inliner.InlineIf(node); !s.ok()) return s;
      changed = true;
    } else if (node.op_type == "Loop" && LoopDecided(graph, node)) {
      if (absl::Status s = inliner.UnrollLoop(node, conditions); !s.ok()) return s;
      changed = true;
    } else {
      out.push_back(std::move(node));
    }
  }
  graph.nodes() = std::move(out);
  return changed;
}

namespace {

// The nodes (indices, in order) and graph inputs VALUE is computed from.
struct Ancestry {
  std::vector<int> nodes;
  std::vector<ValueId> inputs;
};

Ancestry AncestryOf(const Graph& graph, ValueId value,
                    const absl::flat_hash_map<ValueId, int>& producer) {
  Ancestry a;
  std::vector<bool> seen(graph.num_values(), false);
  std::set<int> nodes;
  std::vector<ValueId> stack = {value};
  while (!stack.empty()) {
    const ValueId v = stack.back();
    stack.pop_back();
    if (v == kNoValue || seen[v]) continue;
    seen[v] = true;
    const auto it = producer.find(v);
    if (it == producer.end()) continue;
    nodes.insert(it->second);
    for (ValueId in : graph.nodes()[it->second].inputs) stack.push_back(in);
  }
  for (ValueId in : graph.inputs()) {
    if (seen[in]) a.inputs.push_back(in);
  }
  a.nodes.assign(nodes.begin(), nodes.end());
  return a;
}

// A graph of ANCESTRY's nodes alone, its one output VALUE.
Graph CopyOf(const Graph& graph, const Ancestry& ancestry, ValueId value) {
  Graph sub;
  sub.set_opset(graph.opset());
  auto copy = [&](ValueId v) {
    if (v == kNoValue) return kNoValue;
    const ValueId id = sub.GetOrAddValue(graph.value(v).name);
    sub.value(id) = graph.value(v);
    if (const Constant* c = graph.FindConstant(v); c != nullptr) sub.SetConstant(id, *c);
    return id;
  };
  for (ValueId in : ancestry.inputs) sub.inputs().push_back(copy(in));
  for (int i : ancestry.nodes) {
    Node node = graph.nodes()[i];
    for (ValueId& v : node.inputs) v = copy(v);
    for (ValueId& v : node.outputs) v = copy(v);
    sub.nodes().push_back(std::move(node));
  }
  sub.outputs().push_back(copy(value));
  return sub;
}

// The one value of a folded decision, or nullopt when it did not fold to
// one value.
std::optional<int64_t> FoldedValue(const Graph& graph, ValueId value) {
  const Constant* c = graph.FindConstant(value);
  if (c == nullptr || kernels::NumElements(c->shape) != 1) return std::nullopt;
  return ScalarOf(*c);
}

}  // namespace

std::vector<PendingDecision> RecordDecisions(const Graph& graph) {
  std::vector<PendingDecision> pending;
  absl::flat_hash_map<ValueId, int> producer;
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    for (ValueId out : graph.nodes()[i].outputs) producer[out] = static_cast<int>(i);
  }
  for (const Node& node : graph.nodes()) {
    std::vector<std::pair<size_t, std::string>> decided;
    if (node.op_type == "If") decided = {{0, "condition"}};
    if (node.op_type == "Loop") decided = {{0, "trip count M"}, {1, "condition"}};
    for (const auto& [index, what] : decided) {
      if (!HasInput(node, index) || graph.IsConstant(node.inputs[index])) continue;
      const ValueId value = node.inputs[index];
      const Ancestry ancestry = AncestryOf(graph, value, producer);
      // From constants and fixed shapes alone, it folds exactly.
      bool dynamic = false;
      for (ValueId in : ancestry.inputs) {
        for (int64_t d : graph.value(in).shape) dynamic = dynamic || d < 0;
      }
      if (!dynamic) continue;
      pending.push_back({.node = node.Describe(),
                         .what = what,
                         .input = graph.value(ancestry.inputs[0]).name,
                         .value = value,
                         .nodes = CopyOf(graph, ancestry, value)});
    }
  }
  return pending;
}

absl::Status CheckDecisions(const Graph& graph, const std::vector<PendingDecision>& pending) {
  for (const PendingDecision& p : pending) {
    const std::optional<int64_t> folded = FoldedValue(graph, p.value);
    if (!folded.has_value()) continue;  // not decided: refused or run as it is
    for (int64_t dim : kDecisionCheckDims) {
      Graph at = p.nodes;
      for (ValueId in : at.inputs()) {
        for (int64_t& d : at.value(in).shape) {
          if (d < 0) d = dim;
        }
      }
      auto result = FoldConstants(at);
      if (result.ok() && FoldedValue(at, at.outputs()[0]) == folded) continue;
      return absl::UnimplementedError(absl::StrCat(
          p.node, ": ", p.what, " depends on input '", p.input,
          "' (it differs where its dynamic dims are ", dim, "); only ",
          p.what == "condition" ? "conditions" : "trip counts", " known at load are supported"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLoopConditions(const Graph& graph, const std::vector<LoopCondition>& conditions) {
  for (const LoopCondition& c : conditions) {
    const auto id = graph.FindValue(c.value);
    const Constant* value = id.has_value() ? graph.FindConstant(*id) : nullptr;
    if (value != nullptr && kernels::NumElements(value->shape) == 1 && ScalarOf(*value) != 0) {
      continue;
    }
    return absl::UnimplementedError(absl::StrCat(
        c.loop, ": its condition after iteration ", c.iteration,
        " is not known at load to stay true; only loops that run all M iterations are supported"));
  }
  return absl::OkStatus();
}

}  // namespace numaserve::engine
