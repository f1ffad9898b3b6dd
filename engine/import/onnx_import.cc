#include "engine/import/onnx_import.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <new>
#include <set>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/import/constant_folding.h"
#include "engine/import/control_flow.h"
#include "engine/import/external_data.h"
#include "engine/import/onnx_read.h"
#include "engine/import/sequence_rewrite.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/shape_propagation.h"
#include "engine/ops/typed_exec.h"
#include "kernels/tensor.h"

namespace numaserve::engine {
namespace {

// The largest |axis| an attribute may name: far above any rank a model
// has, far below where libonnx's axis arithmetic overflows.
constexpr int64_t kMaxAxisMagnitude = 1024;

// Attributes libonnx's shape inference divides by or indexes with without
// checking (a Conv or MaxPool with strides 0 is a SIGFPE inside
// onnx::convPoolShapeInference in libonnx 1.12, a LayerNormalization with
// axis 2^63-1 a SEGV, which no try/catch stops): refused before it runs.
absl::Status CheckAttributesForOnnx(const onnx::GraphProto& g) {
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto& proto = g.node(i);
    for (const onnx::AttributeProto& a : proto.attribute()) {
      // libonnx infers the shapes inside If and Loop subgraphs too.
      if (a.has_g()) {
        if (absl::Status s = CheckAttributesForOnnx(a.g()); !s.ok()) return s;
      }
      if (a.name() == "axis" || a.name() == "axes" || a.name() == "perm") {
        std::vector<int64_t> values(a.ints().begin(), a.ints().end());
        if (a.type() == onnx::AttributeProto::INT) values.push_back(a.i());
        for (int64_t v : values) {
          if (v >= -kMaxAxisMagnitude && v <= kMaxAxisMagnitude) continue;
          const std::string name =
              proto.name().empty() ? absl::StrCat(proto.op_type(), "_", i) : proto.name();
          return absl::InvalidArgumentError(absl::StrCat(
              "node '", name, "' (op ", proto.op_type(), "): attribute '", a.name(), "' has ", v,
              "; it must be in -", kMaxAxisMagnitude, "..", kMaxAxisMagnitude));
        }
        continue;
      }
      const bool window = a.name() == "strides" || a.name() == "dilations" ||
                          a.name() == "kernel_shape" || a.name() == "blocksize";
      if (!window) continue;
      std::vector<int64_t> values(a.ints().begin(), a.ints().end());
      if (a.type() == onnx::AttributeProto::INT) values.push_back(a.i());
      for (int64_t v : values) {
        if (v >= 1 && v <= kernels::kMaxTensorElements) continue;
        const std::string name =
            proto.name().empty() ? absl::StrCat(proto.op_type(), "_", i) : proto.name();
        return absl::InvalidArgumentError(
            absl::StrCat("node '", name, "' (op ", proto.op_type(), "): attribute '", a.name(),
                         "' has ", v, "; it must be in 1..", kernels::kMaxTensorElements));
      }
    }
  }
  return absl::OkStatus();
}

// A Conv or ConvTranspose without kernel_shape takes it from its weights'
// shape inside onnx::convPoolShapeInference, which then indexes the
// dilations by the weights' spatial dims: weights of higher rank than the
// input read past the end (a SEGV in libonnx 1.12). The attribute is made
// explicit here from the weights' rank where that is known before shape
// inference (an initializer, a graph input with a shape, a Constant, or
// one of those through DequantizeLinear, QuantizeLinear, Identity or
// Cast), so ONNX compares it with the input's rank and fails cleanly; a
// conv whose weights' rank is not known so is refused.
// A subgraph's convs (an If's branch, a Loop's body) are made explicit the
// same way, knowing what its enclosing graphs know (OUTER).
absl::Status MakeKernelShapesExplicit(onnx::GraphProto* g,
                                      std::map<std::string, std::vector<int64_t>> outer = {}) {
  std::map<std::string, std::vector<int64_t>> dims =
      std::move(outer);                                   // of values whose dims are known
  for (const auto& v : g->input()) dims.erase(v.name());  // a body's inputs hide outer names
  for (const auto& t : g->initializer()) dims[t.name()] = {t.dims().begin(), t.dims().end()};
  for (const auto& v : g->input()) {
    if (dims.count(v.name()) != 0 || !v.type().tensor_type().has_shape()) continue;
    std::vector<int64_t> d;
    for (const auto& dim : v.type().tensor_type().shape().dim()) {
      d.push_back(dim.has_dim_value() ? dim.dim_value() : -1);
    }
    dims[v.name()] = d;
  }
  for (int i = 0; i < g->node_size(); ++i) {
    onnx::NodeProto* node = g->mutable_node(i);
    const std::string& op = node->op_type();
    for (onnx::AttributeProto& a : *node->mutable_attribute()) {
      if (!a.has_g()) continue;
      if (absl::Status s = MakeKernelShapesExplicit(a.mutable_g(), dims); !s.ok()) return s;
    }
    if (op == "Constant" && node->output_size() == 1) {
      for (const auto& a : node->attribute()) {
        if (a.name() == "value" && a.has_t()) {
          dims[node->output(0)] = {a.t().dims().begin(), a.t().dims().end()};
        }
      }
      continue;
    }
    const bool same_shape =
        op == "DequantizeLinear" || op == "QuantizeLinear" || op == "Identity" || op == "Cast";
    if (same_shape && node->input_size() > 0 && node->output_size() >= 1) {
      if (auto d = dims.find(node->input(0)); d != dims.end()) {
        dims[node->output(0)] = d->second;
      }
      continue;
    }
    if (op != "Conv" && op != "ConvTranspose") continue;
    bool has_kernel_shape = false;
    for (const auto& a : node->attribute()) has_kernel_shape |= a.name() == "kernel_shape";
    if (has_kernel_shape || node->input_size() < 2) continue;
    const auto w = dims.find(node->input(1));
    const std::string name = node->name().empty() ? absl::StrCat(op, "_", i) : node->name();
    if (w == dims.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "node '", name, "' (op ", op,
          "): without kernel_shape, its weights' shape must be known before shape inference "
          "(an initializer or a graph input with a shape); add kernel_shape"));
    }
    if (w->second.size() < 3) {
      return absl::InvalidArgumentError(absl::StrCat("node '", name, "' (op ", op,
                                                     "): weights of rank ", w->second.size(),
                                                     "; a conv's weights have rank 3 or more"));
    }
    onnx::AttributeProto* k = node->add_attribute();
    k->set_name("kernel_shape");
    k->set_type(onnx::AttributeProto::INTS);
    for (size_t d = 2; d < w->second.size(); ++d) {
      if (w->second[d] < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("node '", name, "' (op ", op,
                         "): its weights' spatial dims must be known and positive"));
      }
      k->add_ints(w->second[d]);
    }
  }
  return absl::OkStatus();
}

// libonnx's checker, then its shape inference (strict), on `model` as it
// is: what they throw becomes INVALID_ARGUMENT.
absl::Status CheckAndInferAsIs(onnx::ModelProto& model) {
  try {
    onnx::checker::check_model(model);
    onnx::shape_inference::InferShapes(
        model, onnx::OpSchemaRegistry::Instance(),
        onnx::ShapeInferenceOptions(/*check_type_val=*/true, /*strict_mode_val=*/1));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return absl::OkStatus();
}

void AddIntAttribute(onnx::NodeProto* node, const std::string& name, int64_t value) {
  onnx::AttributeProto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

// libonnx 1.12's LayerNormalization shape inference, when the node asks
// for Mean or InvStdDev, sets the statistics' dims from `axis` on without
// checking it against the input's rank: a rank-0 input with axis -1 is a
// SEGV at dim(-1), which no try/catch stops. The rank is often known only
// after inference, so such a model is first inferred as a copy whose
// LayerNormalizations lose their statistics outputs (their readers get
// stand-ins of the same rank and type); each one's axis is then checked
// against the rank its input got there.
absl::Status CheckLayerNormStatistics(const onnx::ModelProto& model) {
  const onnx::GraphProto& g = model.graph();
  bool any = false;
  for (const onnx::NodeProto& n : g.node()) {
    any = any || (n.op_type() == "LayerNormalization" && n.output_size() > 1);
  }
  if (!any) return absl::OkStatus();
  onnx::ModelProto copy = model;
  onnx::GraphProto* cg = copy.mutable_graph();
  cg->clear_node();
  // The stand-ins' dims differ from the statistics' own: the copy keeps no
  // declared shapes of inner values, nor the statistics among its outputs.
  cg->clear_value_info();
  std::set<std::string> statistics;
  for (const onnx::NodeProto& n : g.node()) {
    if (n.op_type() != "LayerNormalization") continue;
    for (int o = 1; o < n.output_size(); ++o) statistics.insert(n.output(o));
  }
  for (int o = cg->output_size() - 1; o >= 0; --o) {
    if (statistics.count(cg->output(o).name()) != 0) cg->mutable_output()->DeleteSubrange(o, 1);
  }
  for (const onnx::NodeProto& n : g.node()) {
    onnx::NodeProto* kept = cg->add_node();
    *kept = n;
    if (n.op_type() != "LayerNormalization" || n.output_size() <= 1 || n.input_size() < 1) {
      continue;
    }
    kept->mutable_output()->DeleteSubrange(1, n.output_size() - 1);
    // Each statistic, for its readers, as ReduceMean(X) with keepdims and
    // no axes: X's rank, every dim 1 (broadcasts as the statistic does),
    // cast to FLOAT as LayerNormalization's statistics are.
    for (int o = 1; o < n.output_size(); ++o) {
      if (n.output(o).empty()) continue;
      const std::string reduced = absl::StrCat(n.output(o), "__numaserve_rank_check");
      onnx::NodeProto* mean = cg->add_node();
      mean->set_op_type("ReduceMean");
      mean->add_input(n.input(0));
      mean->add_output(reduced);
      AddIntAttribute(mean, "keepdims", 1);
      onnx::NodeProto* cast = cg->add_node();
      cast->set_op_type("Cast");
      cast->add_input(reduced);
      cast->add_output(n.output(o));
      AddIntAttribute(cast, "to", onnx::TensorProto::FLOAT);
    }
  }
  if (absl::Status s = CheckAndInferAsIs(copy); !s.ok()) return s;
  std::map<std::string, int> rank;
  auto note = [&](const onnx::ValueInfoProto& v) {
    if (v.type().has_tensor_type() && v.type().tensor_type().has_shape()) {
      rank[v.name()] = v.type().tensor_type().shape().dim_size();
    }
  };
  for (const auto& v : copy.graph().input()) note(v);
  for (const auto& v : copy.graph().value_info()) note(v);
  for (const auto& v : copy.graph().output()) note(v);
  for (const auto& t : copy.graph().initializer()) rank[t.name()] = t.dims_size();
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto& n = g.node(i);
    if (n.op_type() != "LayerNormalization" || n.output_size() <= 1 || n.input_size() < 1) {
      continue;
    }
    const auto r = rank.find(n.input(0));
    if (r == rank.end()) continue;  // unknown: libonnx infers nothing for it
    int64_t axis = -1;
    for (const auto& a : n.attribute()) {
      if (a.name() == "axis") axis = a.i();
    }
    if (r->second >= 1 && axis >= -r->second && axis < r->second) continue;
    const std::string name = n.name().empty() ? absl::StrCat(n.op_type(), "_", i) : n.name();
    return absl::InvalidArgumentError(
        absl::StrCat("node '", name, "' (op LayerNormalization): axis ", axis,
                     " is not an axis of its input '", n.input(0), "' of rank ", r->second));
  }
  return absl::OkStatus();
}

// A LayerNormalization asking for its statistics inside a subgraph (an
// If's branch, a Loop's body) is refused: CheckLayerNormStatistics checks
// their axis in the main graph only.
absl::Status RefuseStatisticsInSubgraphs(const onnx::GraphProto& g, bool nested) {
  for (const onnx::NodeProto& n : g.node()) {
    if (nested && n.op_type() == "LayerNormalization" && n.output_size() > 1) {
      return absl::UnimplementedError(
          absl::StrCat("node '", n.name(),
                       "' (op LayerNormalization): Mean or InvStdDev inside a subgraph of an If "
                       "or Loop is not supported"));
    }
    for (const onnx::AttributeProto& a : n.attribute()) {
      if (!a.has_g()) continue;
      if (absl::Status s = RefuseStatisticsInSubgraphs(a.g(), true); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status CheckAndInfer(onnx::ModelProto& model) {
  if (absl::Status s = RefuseStatisticsInSubgraphs(model.graph(), false); !s.ok()) return s;
  if (absl::Status s = CheckLayerNormStatistics(model); !s.ok()) return s;
  return CheckAndInferAsIs(model);
}

absl::Status CheckOpsSupported(const onnx::GraphProto& g) {
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto& proto = g.node(i);
    const bool default_domain = proto.domain().empty() || proto.domain() == "ai.onnx";
    if (default_domain && (proto.op_type() == "Constant" || FindOpSchema(proto.op_type()))) {
      continue;
    }
    const std::string name =
        proto.name().empty() ? absl::StrCat(proto.op_type(), "_", i) : proto.name();
    return absl::UnimplementedError(
        absl::StrCat("node '", name, "' (op ", proto.op_type(), default_domain ? "" : " in domain ",
                     default_domain ? "" : proto.domain(),
                     ") is not supported (supported: ", SupportedOpsList(), ")"));
  }
  return absl::OkStatus();
}

// Why a graph input/output's type is not supported, for the error.
std::string TypeProblem(const onnx::ValueInfoProto& info) {
  if (!info.type().has_tensor_type()) {
    return "is not a tensor (sequences, maps and optionals are not supported)";
  }
  const int32_t t = info.type().tensor_type().elem_type();
  const std::string name =
      onnx::TensorProto::DataType_IsValid(t)
          ? onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(t))
          : absl::StrCat(t);
  return absl::StrCat("has element type ", name,
                      ", which is not supported (supported: BOOL, UINT8/16/32/64, INT8/16/32/64, "
                      "FLOAT16, BFLOAT16, FLOAT, DOUBLE)");
}

// Constant folding under the import's budget; what it held to *FOLDING
// when given.
absl::Status Fold(const ImportOptions& options, Graph& graph, FoldResult* folding) {
  auto folded = FoldConstants(graph, FoldOptions{.budget_bytes = options.fold_budget_bytes});
  if (!folded.ok()) return folded.status();
  if (folding != nullptr) *folding = *folded;
  return absl::OkStatus();
}

// Folds constants, then inlines the If and Loop nodes that folding decided
// (control_flow.h) and folds again, until none is left to decide (at most
// kMaxRounds rounds: what stays is refused by validation). Every round
// holds its folded constants to what the budget has left.
absl::Status FoldAndInline(const ImportOptions& options, Subgraphs& subgraphs, Graph& graph,
                           FoldResult* folding) {
  constexpr int kMaxRounds = 64;
  FoldResult total;
  std::vector<PendingDecision> decisions = RecordDecisions(graph);
  if (absl::Status s = Fold(options, graph, &total); !s.ok()) return s;
  std::vector<LoopCondition> conditions;
  for (int round = 0; round < kMaxRounds; ++round) {
    if (absl::Status s = CheckDecisions(graph, decisions); !s.ok()) return s;
    auto changed = InlineControlFlow(graph, subgraphs, conditions);
    if (!changed.ok()) return changed.status();
    if (!*changed) break;
    decisions = RecordDecisions(graph);
    FoldResult more;
    const ImportOptions left{.fold_budget_bytes =
                                 std::max<int64_t>(total.budget_bytes - total.folded_bytes, 1)};
    if (absl::Status s = Fold(left, graph, &more); !s.ok()) return s;
    total.folded_nodes += more.folded_nodes;
    total.folded_bytes += more.folded_bytes;
  }
  if (absl::Status s = CheckDecisions(graph, decisions); !s.ok()) return s;
  if (folding != nullptr) *folding = total;
  return CheckLoopConditions(graph, conditions);
}

// Validates every shape at a concrete batch (Reshape targets, broadcasts),
// other dynamic dims at kProbeDims[0] (a signature of its own is checked
// when it first runs).
absl::Status CheckShapesAtProbe(const Graph& graph) {
  auto shapes = PropagateShapes(graph, ProbeInputShapes(graph, 0));
  if (shapes.ok() || !HasDynamicNonBatchDims(graph)) return shapes.status();
  return absl::Status(shapes.status().code(),
                      absl::StrCat("at batch 1, other dynamic dims ", kProbeDims[0], ": ",
                                   shapes.status().message()));
}

// Validates every node. What the graph computes from shapes (a Reshape's
// target from Shape -> Gather -> Concat, a Slice's ends, a Range's limit)
// is known once the input shapes are: it is computed again exactly at each
// signature (PropagateShapesAndValues), and here at the first probe, where
// the nodes reading it are validated with it. A value computed from an
// input's elements is no shape value: the node that needs it as a
// constant is refused, naming itself and the input.
// The small ones are the graph's shape parameters (Graph::AddShapeParameter).
absl::Status ValidateNodes(Graph& graph) {
  ShapeValues values;
  // As far as it gets: where it stops, CheckShapesAtProbe says why.
  (void)PropagateShapesAndValues(graph, ProbeInputShapes(graph, 0), values);
  std::vector<ValueId> parameters;
  for (const auto& [id, value] : values) {
    if (kernels::NumElements(value.shape) <= kMaxShapeParameterElements) parameters.push_back(id);
  }
  std::sort(parameters.begin(), parameters.end());
  for (ValueId id : parameters) graph.AddShapeParameter(id);
  for (const Node& node : graph.nodes()) {
    // If and Loop are decided at load or refused: they never read a value
    // that changes with the signature.
    const bool at_load = node.op_type == "If" || node.op_type == "Loop";
    const ScopedShapeValues scope(&graph, at_load ? nullptr : &values);
    if (absl::Status s = FindOpSchema(node.op_type)->validate(graph, node); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Each main-graph initializer's bytes are released from MODEL once the
// graph holds them, so a model's weights are held twice only one tensor at
// a time.
absl::StatusOr<Graph> BuildGraph(onnx::ModelProto& model, const ImportOptions& options,
                                 FoldResult* folding) {
  Graph graph;
  Subgraphs subgraphs;
  for (const auto& opset : model.opset_import()) {
    if (opset.domain().empty() || opset.domain() == "ai.onnx") graph.set_opset(opset.version());
  }
  const onnx::GraphProto& g = model.graph();
  absl::flat_hash_set<std::string> initializer_names;
  for (onnx::TensorProto& t : *model.mutable_graph()->mutable_initializer()) {
    auto c = ReadConstant(t);
    if (!c.ok()) return c.status();
    std::string().swap(*t.mutable_raw_data());
    const ValueId id = graph.GetOrAddValue(t.name());
    graph.value(id).type = c->type;
    graph.value(id).shape = c->shape;
    graph.value(id).has_shape = true;
    graph.SetConstant(id, *std::move(c));
    initializer_names.insert(t.name());
  }
  for (const onnx::ValueInfoProto& in : g.input()) {
    if (initializer_names.contains(in.name())) continue;  // a weight, not a runtime input
    const ValueId id = graph.GetOrAddValue(in.name());
    ReadValueInfo(in, graph.value(id));
    const Value& v = graph.value(id);
    if (v.type == DataType::kUnknown) {
      return absl::UnimplementedError(absl::StrCat("input '", in.name(), "' ", TypeProblem(in)));
    }
    if (!v.has_shape) {
      return absl::InvalidArgumentError(absl::StrCat("input '", in.name(), "' has no shape"));
    }
    // Any dim may be dynamic (dim 0 is the batch; the others, such as a
    // sequence length or an image's height, are given per run with the
    // input shapes). What is fixed must fit the limit per tensor with every
    // dynamic dim at 1 (the sizes of a run are checked per run).
    Shape row = v.shape;
    for (int64_t& d : row) {
      if (d < 0) d = 1;
    }
    if (auto n = kernels::NumElementsChecked(row); !n.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", in.name(), "': ", n.status().message()));
    }
    graph.inputs().push_back(id);
  }
  for (const onnx::ValueInfoProto& vi : g.value_info()) {
    ReadValueInfo(vi, graph.value(graph.GetOrAddValue(vi.name())));
  }
  int index = 0;
  for (const onnx::NodeProto& proto : g.node()) {
    if (proto.op_type() == "Constant" && (proto.domain().empty() || proto.domain() == "ai.onnx")) {
      if (absl::Status s = ReadConstantNode(proto, graph, NameScope{}); !s.ok()) return s;
    } else {
      auto node = ReadNode(proto, index, graph, NameScope{}, subgraphs);
      if (!node.ok()) return node.status();
      graph.nodes().push_back(*std::move(node));
    }
    ++index;
  }
  for (const onnx::ValueInfoProto& out : g.output()) {
    const ValueId id = graph.GetOrAddValue(out.name());
    ReadValueInfo(out, graph.value(id));
    if (graph.value(id).type == DataType::kUnknown) {
      return absl::UnimplementedError(absl::StrCat("output '", out.name(), "' ", TypeProblem(out)));
    }
    graph.outputs().push_back(id);
  }
  if (absl::Status s = FoldAndInline(options, subgraphs, graph, folding); !s.ok()) return s;
  if (absl::Status s = ValidateNodes(graph); !s.ok()) return s;
  // Values of types other than FP32 at runtime: only ops with a typed
  // reference for those types may touch them.
  for (const Node& node : graph.nodes()) {
    if (!NeedsTypedRun(graph, node)) continue;
    if (absl::Status s = CheckTypedNode(graph, node); !s.ok()) return s;
  }
  if (absl::Status s = CheckShapesAtProbe(graph); !s.ok()) return s;
  return graph;
}

absl::Status Prefix(const std::string& path, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
}

absl::StatusOr<Graph> ImportUnguarded(const std::string& path, const ImportOptions& options,
                                      FoldResult* folding) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat(path, ": cannot open the model file"));
  std::stringstream bytes;
  bytes << file.rdbuf();
  onnx::ModelProto model;
  if (!model.ParseFromString(bytes.str())) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid ONNX protobuf"));
  }
  // Sequences the engine does without (a SplitToSequence read at constant
  // indices, a Loop carrying a sequence nothing reads), then what no output
  // needs: ops the engine lacks may go with them.
  int64_t opset = 0;
  for (const auto& o : model.opset_import()) {
    if (o.domain().empty() || o.domain() == "ai.onnx") opset = o.version();
  }
  if (absl::Status s = RewriteSplitToSequence(*model.mutable_graph(), opset); !s.ok()) {
    return Prefix(path, s);
  }
  DropDeadNodes(*model.mutable_graph());
  // Unsupported ops first: the most useful message when there are any.
  if (absl::Status s = CheckOpsSupported(model.graph()); !s.ok()) return Prefix(path, s);
  if (absl::Status s = CheckAttributesForOnnx(model.graph()); !s.ok()) return Prefix(path, s);
  if (absl::Status s = LoadExternalData(model, path); !s.ok()) return Prefix(path, s);
  if (absl::Status s = MakeKernelShapesExplicit(model.mutable_graph()); !s.ok()) {
    return Prefix(path, s);
  }
  if (absl::Status s = CheckAndInfer(model); !s.ok()) return Prefix(path, s);
  auto graph = BuildGraph(model, options, folding);
  if (!graph.ok()) return Prefix(path, graph.status());
  return graph;
}

}  // namespace

absl::StatusOr<Graph> ImportOnnxModel(const std::string& path, const ImportOptions& options,
                                      FoldResult* folding) {
  // Whatever a hostile file still makes throw (an allocation the checks did
  // not foresee, libonnx or protobuf internals) fails this model only.
  try {
    return ImportUnguarded(path, options, folding);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": out of memory importing the model (std::bad_alloc)"));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": importing the model failed: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(path, ": importing the model failed: unknown error"));
  }
}

}  // namespace numaserve::engine
