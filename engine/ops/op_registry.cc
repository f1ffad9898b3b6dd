#include "engine/ops/op_registry.h"

#include <algorithm>
#include <array>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"
#include "kernels/ref/add_ref.h"
#include "kernels/ref/gemm_ref.h"
#include "kernels/ref/layout_ref.h"
#include "kernels/ref/softmax_ref.h"
#include "kernels/shape_ops.h"

namespace numaserve::engine {
namespace {

using kernels::Tensor;
using ShapesOr = absl::StatusOr<std::vector<Shape>>;
using TensorsOr = absl::StatusOr<std::vector<Tensor>>;

absl::Status NodeError(const Node& node, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(node.Describe(), ": ", message));
}

// Between min_in and max_in inputs, the first present (an optional input
// after it may be absent), and one output.
absl::Status CheckArity(const Node& node, size_t min_in, size_t max_in) {
  if (node.inputs.size() < min_in || node.inputs.size() > max_in || node.inputs.empty() ||
      node.inputs[0] == kNoValue) {
    return NodeError(
        node, absl::StrCat("expects ", min_in, "..", max_in, " inputs, has ", node.inputs.size()));
  }
  if (node.outputs.size() != 1) return NodeError(node, "expects exactly one output");
  return absl::OkStatus();
}

TensorsOr One(absl::StatusOr<Tensor> t) {
  if (!t.ok()) return t.status();
  std::vector<Tensor> out;
  out.push_back(*std::move(t));
  return out;
}

double NoFlops(const Node&, const std::vector<const Shape*>&) { return 0.0; }

// --- Gemm -------------------------------------------------------------------

kernels::GemmAttrs GemmAttrsOf(const Node& node) {
  return {.alpha = node.GetFloat("alpha", 1.0f),
          .beta = node.GetFloat("beta", 1.0f),
          .trans_a = node.GetInt("transA", 0) != 0,
          .trans_b = node.GetInt("transB", 0) != 0};
}

absl::Status GemmValidate(const Graph&, const Node& node) { return CheckArity(node, 2, 3); }

ShapesOr GemmShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  const Shape& a = *in[0];
  const Shape& b = *in[1];
  if (a.size() != 2 || b.size() != 2) {
    return NodeError(node, absl::StrCat("A and B must be 2-D, got ", kernels::ShapeToString(a),
                                        " and ", kernels::ShapeToString(b)));
  }
  const kernels::GemmAttrs attrs = GemmAttrsOf(node);
  const int64_t m = attrs.trans_a ? a[1] : a[0];
  const int64_t k = attrs.trans_a ? a[0] : a[1];
  const int64_t kb = attrs.trans_b ? b[1] : b[0];
  const int64_t n = attrs.trans_b ? b[0] : b[1];
  if (k != kb) return NodeError(node, absl::StrCat("inner dims differ: ", k, " vs ", kb));
  Shape y = {m, n};
  if (in.size() > 2 && in[2] != nullptr) {
    auto bc = kernels::BroadcastShapes(*in[2], y);
    if (!bc.ok() || *bc != y) {
      return NodeError(node, absl::StrCat("C ", kernels::ShapeToString(*in[2]),
                                          " does not broadcast to ", kernels::ShapeToString(y)));
    }
  }
  return std::vector<Shape>{y};
}

TensorsOr GemmReference(const Graph&, const Node& node, const std::vector<const Tensor*>& in) {
  const Tensor* c = in.size() > 2 ? in[2] : nullptr;
  return One(kernels::GemmRef(*in[0], *in[1], c, GemmAttrsOf(node)));
}

double GemmFlops(const Node& node, const std::vector<const Shape*>& in) {
  const bool ta = node.GetInt("transA", 0) != 0, tb = node.GetInt("transB", 0) != 0;
  const double m = (*in[0])[ta ? 1 : 0], k = (*in[0])[ta ? 0 : 1], n = (*in[1])[tb ? 0 : 1];
  return 2.0 * m * n * k;
}

// --- MatMul -----------------------------------------------------------------

absl::Status MatMulValidate(const Graph&, const Node& node) {
  if (absl::Status s = CheckArity(node, 2, 2); !s.ok()) return s;
  if (node.inputs[1] == kNoValue) return NodeError(node, "needs two inputs");
  return absl::OkStatus();
}

ShapesOr MatMulShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  auto s = kernels::MatMulShape(*in[0], *in[1]);
  if (!s.ok()) return NodeError(node, s.status().message());
  return std::vector<Shape>{*s};
}

TensorsOr MatMulReference(const Graph&, const Node& node, const std::vector<const Tensor*>& in) {
  auto y = kernels::BatchedMatMulRef(*in[0], *in[1]);
  if (!y.ok()) return NodeError(node, y.status().message());
  return One(*std::move(y));
}

double MatMulFlops(const Node&, const std::vector<const Shape*>& in) {
  auto out = kernels::MatMulShape(*in[0], *in[1]);
  if (!out.ok()) return 0.0;
  return 2.0 * kernels::NumElements(*out) * in[0]->back();
}

// --- Add, Relu, Identity ----------------------------------------------------

absl::Status UnaryValidate(const Graph&, const Node& node) { return CheckArity(node, 1, 1); }

TensorsOr IdentityReference(const Graph&, const Node&, const std::vector<const Tensor*>& in) {
  return One(*in[0]);
}

// --- Softmax ----------------------------------------------------------------

ShapesOr SoftmaxShapes(const Graph& graph, const Node& node, const std::vector<const Shape*>& in) {
  const int64_t rank = std::max<int64_t>(static_cast<int64_t>(in[0]->size()), 1);
  auto axis = kernels::NormalizeAxis(GetSoftmaxSemantics(graph, node).axis, rank);
  if (!axis.ok()) return NodeError(node, axis.status().message());
  return std::vector<Shape>{*in[0]};
}

TensorsOr SoftmaxReference(const Graph& graph, const Node& node,
                           const std::vector<const Tensor*>& in) {
  const SoftmaxSemantics sm = GetSoftmaxSemantics(graph, node);
  return One(kernels::SoftmaxRef(*in[0], sm.axis, sm.flatten_to_2d));
}

// --- Flatten, Reshape -------------------------------------------------------

ShapesOr FlattenShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  auto s = kernels::FlattenShape(*in[0], node.GetInt("axis", 1));
  if (!s.ok()) return NodeError(node, s.status().message());
  return std::vector<Shape>{*s};
}

absl::Status ReshapeValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 2, 2); !s.ok()) return s;
  return ReshapeTarget(graph, node).status();
}

ShapesOr ReshapeShapes(const Graph& graph, const Node& node, const std::vector<const Shape*>& in) {
  auto target = ReshapeTarget(graph, node);
  if (!target.ok()) return target.status();
  auto s = kernels::ReshapeShape(*in[0], *target, node.GetInt("allowzero", 0) != 0);
  if (!s.ok()) return NodeError(node, s.status().message());
  return std::vector<Shape>{*s};
}

// Flatten and Reshape only reinterpret the shape: the reference copies the
// data under the shape inferred for the node.
TensorsOr ViewReference(const Graph& graph, const Node& node,
                        const std::vector<const Tensor*>& in) {
  const OpSchema* schema = FindOpSchema(node.op_type);
  std::vector<const Shape*> shapes;
  for (const Tensor* t : in) shapes.push_back(t != nullptr ? &t->shape : nullptr);
  auto out_shapes = schema->infer_shapes(graph, node, shapes);
  if (!out_shapes.ok()) return out_shapes.status();
  return One(Tensor((*out_shapes)[0], in[0]->data));
}

constexpr std::array<OpSchema, 6> kCoreOps = {{
    {"Flatten", UnaryValidate, FlattenShapes, ViewReference, NoFlops},
    {"Gemm", GemmValidate, GemmShapes, GemmReference, GemmFlops},
    {"Identity", UnaryValidate, ops::SameShape, IdentityReference, NoFlops},
    {"MatMul", MatMulValidate, MatMulShapes, MatMulReference, MatMulFlops},
    {"Reshape", ReshapeValidate, ReshapeShapes, ViewReference, NoFlops},
    {"Softmax", UnaryValidate, SoftmaxShapes, SoftmaxReference, NoFlops},
}};

// Every op, sorted by name (built once).
const std::vector<OpSchema>& AllOps() {
  static const std::vector<OpSchema>* ops = [] {
    auto* table = new std::vector<OpSchema>(kCoreOps.begin(), kCoreOps.end());
    // Each family's rows are the ones its adder appended.
    auto add = [table](absl::string_view family, void (*adder)(std::vector<OpSchema>&)) {
      if (adder != nullptr) adder(*table);
      for (OpSchema& op : *table) {
        if (op.family.empty()) op.family = family;
      }
    };
    add("matrix, shape", nullptr);
    add("matrix, shape", ops::AddEinsumOps);
    add("element-wise", ops::AddElementwiseOps);
    add("neural network", ops::AddNnOps);
    add("normalization", ops::AddNormOps);
    add("recurrent", ops::AddRnnOps);
    add("neural network", ops::AddRoiOps);
    add("control flow", ops::AddControlFlowOps);
    add("tensor", ops::AddTensorOps);
    add("tensor", ops::AddResizeOps);
    add("index", ops::AddIndexOps);
    add("index", ops::AddScatterOps);
    add("types, quantization", ops::AddQuantizeOps);
    add("types, quantization", ops::AddTypedOps);
    std::sort(table->begin(), table->end(),
              [](const OpSchema& a, const OpSchema& b) { return a.op_type < b.op_type; });
    return table;
  }();
  return *ops;
}

}  // namespace

const OpSchema* FindOpSchema(absl::string_view op_type) {
  const std::vector<OpSchema>& ops = AllOps();
  auto it = std::lower_bound(ops.begin(), ops.end(), op_type,
                             [](const OpSchema& a, absl::string_view b) { return a.op_type < b; });
  return it != ops.end() && it->op_type == op_type ? &*it : nullptr;
}

absl::Span<const OpSchema> AllOpSchemas() { return AllOps(); }

std::string SupportedOpsList() {
  return absl::StrJoin(AllOps(), ", ", [](std::string* out, const OpSchema& op) {
    absl::StrAppend(out, op.op_type);
  });
}

SoftmaxSemantics GetSoftmaxSemantics(const Graph& graph, const Node& node) {
  const bool before_13 = graph.opset() < 13;
  return {.axis = node.GetInt("axis", before_13 ? 1 : -1), .flatten_to_2d = before_13};
}

absl::StatusOr<std::vector<int64_t>> ReshapeTarget(const Graph& graph, const Node& node) {
  const Constant* c = node.inputs.size() > 1 ? graph.FindConstant(node.inputs[1]) : nullptr;
  if (c == nullptr || (c->type != DataType::kInt64 && c->type != DataType::kInt32)) {
    return NodeError(node, "the target shape must be a constant INT64 tensor (an initializer)");
  }
  return c->i64;
}

}  // namespace numaserve::engine
