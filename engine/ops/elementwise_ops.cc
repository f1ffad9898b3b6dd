// Op table rows for element-wise ops: unary activations and math, binary
// ops with numpy broadcasting, variadic Min/Max/Sum/Mean, comparisons and
// logic (0/1 values), Where.
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"
#include "kernels/ref/elementwise_ref.h"
#include "kernels/shape_ops.h"

namespace numaserve::engine::ops {
namespace {

using kernels::BinaryKind;
using kernels::UnaryKind;
using kernels::UnaryParams;

struct UnaryRow {
  absl::string_view op;
  UnaryKind kind;
};

constexpr UnaryRow kUnary[] = {
    {"Relu", UnaryKind::kRelu},
    {"LeakyRelu", UnaryKind::kLeakyRelu},
    {"Sigmoid", UnaryKind::kSigmoid},
    {"Tanh", UnaryKind::kTanh},
    {"Elu", UnaryKind::kElu},
    {"Selu", UnaryKind::kSelu},
    {"Celu", UnaryKind::kCelu},
    {"Softplus", UnaryKind::kSoftplus},
    {"Softsign", UnaryKind::kSoftsign},
    {"HardSigmoid", UnaryKind::kHardSigmoid},
    {"HardSwish", UnaryKind::kHardSwish},
    {"ThresholdedRelu", UnaryKind::kThresholdedRelu},
    {"Erf", UnaryKind::kErf},
    {"Gelu", UnaryKind::kGelu},  // opset 20; approximate "tanh": kGeluTanh
    {"Sqrt", UnaryKind::kSqrt},
    {"Exp", UnaryKind::kExp},
    {"Log", UnaryKind::kLog},
    {"Abs", UnaryKind::kAbs},
    {"Neg", UnaryKind::kNeg},
    {"Reciprocal", UnaryKind::kReciprocal},
    {"Ceil", UnaryKind::kCeil},
    {"Floor", UnaryKind::kFloor},
    {"Round", UnaryKind::kRound},
    {"Sign", UnaryKind::kSign},
    {"Sin", UnaryKind::kSin},
    {"Cos", UnaryKind::kCos},
    {"Tan", UnaryKind::kTan},
    {"Asin", UnaryKind::kAsin},
    {"Acos", UnaryKind::kAcos},
    {"Atan", UnaryKind::kAtan},
    {"Sinh", UnaryKind::kSinh},
    {"Cosh", UnaryKind::kCosh},
    {"Asinh", UnaryKind::kAsinh},
    {"Acosh", UnaryKind::kAcosh},
    {"Atanh", UnaryKind::kAtanh},
};

}  // namespace

absl::StatusOr<UnaryParams> UnaryParamsOf(const Graph& graph, const Node& node) {
  UnaryParams p;
  if (node.op_type == "Clip") {
    p.kind = UnaryKind::kClip;
    p.alpha = node.GetFloat("min", -std::numeric_limits<float>::infinity());
    p.beta = node.GetFloat("max", std::numeric_limits<float>::infinity());
    for (size_t i = 1; i <= 2; ++i) {
      // A runtime bound is read by the reference from its input tensor.
      if (HasInput(node, i) && !graph.IsConstant(node.inputs[i])) continue;
      auto v = ConstFloats(graph, node, i, i == 1 ? "min" : "max");
      if (!v.ok()) return v.status();
      if (const auto& given = *v; given.has_value()) {
        if (given->size() != 1) return NodeError(node, "min/max must be scalars");
        (i == 1 ? p.alpha : p.beta) = (*given)[0];
      }
    }
    return p;
  }
  bool found = false;
  for (const UnaryRow& row : kUnary) {
    if (row.op == node.op_type) {
      p.kind = row.kind;
      found = true;
    }
  }
  if (!found) return NodeError(node, "not a unary element-wise op");
  switch (p.kind) {
    case UnaryKind::kLeakyRelu:
      p.alpha = node.GetFloat("alpha", 0.01f);
      break;
    case UnaryKind::kElu:
    case UnaryKind::kCelu:
    case UnaryKind::kThresholdedRelu:
      p.alpha = node.GetFloat("alpha", 1.0f);
      break;
    case UnaryKind::kSelu:
      p.alpha = node.GetFloat("alpha", 1.67326319217681884765625f);
      p.beta = node.GetFloat("gamma", 1.05070102214813232421875f);
      break;
    case UnaryKind::kHardSigmoid:
      p.alpha = node.GetFloat("alpha", 0.2f);
      p.beta = node.GetFloat("beta", 0.5f);
      break;
    case UnaryKind::kGelu: {
      const std::string approximate = node.GetString("approximate", "none");
      if (approximate == "tanh") {
        p.kind = UnaryKind::kGeluTanh;
      } else if (approximate != "none") {
        return NodeError(
            node, absl::StrCat("approximate must be 'none' or 'tanh', not '", approximate, "'"));
      }
      break;
    }
    default:
      break;
  }
  return p;
}

namespace {

absl::Status UnaryValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 1, node.op_type == "Clip" ? 3 : 1); !s.ok()) return s;
  return UnaryParamsOf(graph, node).status();
}

TensorsOr UnaryReference(const Graph& graph, const Node& node,
                         const std::vector<const Tensor*>& in) {
  auto p = UnaryParamsOf(graph, node);
  if (!p.ok()) return p.status();
  // Clip's min/max may also be runtime scalars.
  if (node.op_type == "Clip") {
    if (in.size() > 1 && in[1] != nullptr) p->alpha = in[1]->data.at(0);
    if (in.size() > 2 && in[2] != nullptr) p->beta = in[2]->data.at(0);
  }
  return One(kernels::UnaryRef(*p, *in[0]));
}

// --- Binary / variadic -------------------------------------------------------

struct BinaryRow {
  absl::string_view op;
  BinaryKind kind;
};

constexpr BinaryRow kBinary[] = {
    {"Add", BinaryKind::kAdd},  {"Sub", BinaryKind::kSub}, {"Mul", BinaryKind::kMul},
    {"Div", BinaryKind::kDiv},  {"Pow", BinaryKind::kPow}, {"PRelu", BinaryKind::kPRelu},
    {"Min", BinaryKind::kMin},  {"Max", BinaryKind::kMax}, {"Sum", BinaryKind::kAdd},
    {"Mean", BinaryKind::kAdd}, {"Mod", BinaryKind::kMod},
};

}  // namespace

absl::StatusOr<BinaryKind> BinaryKindOf(const Node& node) {
  for (const BinaryRow& row : kBinary) {
    if (row.op == node.op_type) {
      if (row.kind == BinaryKind::kMod && node.GetInt("fmod", 0) != 0) return BinaryKind::kFmod;
      return row.kind;
    }
  }
  return NodeError(node, "not a binary element-wise op");
}

namespace {

bool IsVariadic(const Node& node) {
  return node.op_type == "Min" || node.op_type == "Max" || node.op_type == "Sum" ||
         node.op_type == "Mean";
}

absl::Status BinaryValidate(const Graph& graph, const Node& node) {
  const bool variadic = IsVariadic(node);
  if (absl::Status s = CheckArity(node, variadic ? 1 : 2, variadic ? 64 : 2); !s.ok()) return s;
  for (ValueId v : node.inputs) {
    if (v == kNoValue) return NodeError(node, "inputs may not be omitted");
  }
  // Integer Mod (fmod=0, the divisor's sign) runs on the typed reference.
  if (node.op_type == "Mod" && node.GetInt("fmod", 0) == 0 &&
      !IsIntegerType(graph.value(node.inputs[0]).type)) {
    return NodeError(node, "fmod=0 needs integer inputs; floating-point Mod needs fmod=1");
  }
  return absl::OkStatus();
}

// Before opset 7, PRelu's 1-D slope of size C applies per channel (dim 1).
std::optional<Shape> LegacyPReluSlope(const Graph& graph, const Node& node, const Shape& x,
                                      const Shape& slope) {
  if (node.op_type != "PRelu" || graph.opset() >= 7 || slope.size() != 1 || x.size() < 2 ||
      slope[0] != x[1] || slope[0] == 1) {
    return std::nullopt;
  }
  Shape s(x.size() - 1, 1);
  s[0] = slope[0];
  return s;
}

ShapesOr BroadcastAll(const Graph& graph, const Node& node, const std::vector<const Shape*>& in) {
  Shape out = *in[0];
  for (size_t i = 1; i < in.size(); ++i) {
    if (i == 1 && LegacyPReluSlope(graph, node, *in[0], *in[1]).has_value()) continue;
    auto s = kernels::BroadcastShapes(out, *in[i]);
    if (!s.ok()) return NodeError(node, s.status().message());
    out = *s;
  }
  return std::vector<Shape>{out};
}

TensorsOr BinaryReference(const Graph& graph, const Node& node,
                          const std::vector<const Tensor*>& in) {
  auto kind = BinaryKindOf(node);
  if (!kind.ok()) return kind.status();
  Tensor acc = *in[0];
  for (size_t i = 1; i < in.size(); ++i) {
    Tensor operand = *in[i];
    if (auto s = LegacyPReluSlope(graph, node, acc.shape, operand.shape); s.has_value()) {
      operand.shape = *s;
    }
    auto r = kernels::BinaryRef(*kind, acc, operand);
    if (!r.ok()) return NodeError(node, r.status().message());
    acc = *std::move(r);
  }
  if (node.op_type == "Mean") {
    for (float& v : acc.data) v /= static_cast<float>(in.size());
  }
  return One(std::move(acc));
}

// --- Comparisons and logic (0/1 results) --------------------------------------

absl::Status CompareValidate(const Graph&, const Node& node) {
  return CheckArity(node, node.op_type == "Not" ? 1 : 2, node.op_type == "Not" ? 1 : 2);
}

TensorsOr CompareReference(const Graph&, const Node& node, const std::vector<const Tensor*>& in) {
  const std::string& op = node.op_type;
  if (op == "Not") {
    Tensor y(in[0]->shape);
    for (int64_t i = 0; i < y.size(); ++i) y.data[i] = in[0]->data[i] == 0.0f ? 1.0f : 0.0f;
    return One(std::move(y));
  }
  auto shape = kernels::BroadcastShapes(in[0]->shape, in[1]->shape);
  if (!shape.ok()) return NodeError(node, shape.status().message());
  const auto oa = kernels::BroadcastOffsets(in[0]->shape, *shape);
  const auto ob = kernels::BroadcastOffsets(in[1]->shape, *shape);
  Tensor y(*shape);
  for (int64_t i = 0; i < y.size(); ++i) {
    const float a = in[0]->data[oa[i]], b = in[1]->data[ob[i]];
    bool r = false;
    if (op == "Equal") r = a == b;
    if (op == "Less") r = a < b;
    if (op == "LessOrEqual") r = a <= b;
    if (op == "Greater") r = a > b;
    if (op == "GreaterOrEqual") r = a >= b;
    if (op == "And") r = a != 0.0f && b != 0.0f;
    if (op == "Or") r = a != 0.0f || b != 0.0f;
    if (op == "Xor") r = (a != 0.0f) != (b != 0.0f);
    y.data[i] = r ? 1.0f : 0.0f;
  }
  return One(std::move(y));
}

absl::Status WhereValidate(const Graph&, const Node& node) {
  if (absl::Status s = CheckArity(node, 3, 3); !s.ok()) return s;
  for (ValueId v : node.inputs) {
    if (v == kNoValue) return NodeError(node, "inputs may not be omitted");
  }
  return absl::OkStatus();
}

TensorsOr WhereReference(const Graph&, const Node& node, const std::vector<const Tensor*>& in) {
  auto r = kernels::WhereRef(*in[0], *in[1], *in[2]);
  if (!r.ok()) return NodeError(node, r.status().message());
  return One(*std::move(r));
}

}  // namespace

void AddElementwiseOps(std::vector<OpSchema>& table) {
  for (const UnaryRow& row : kUnary) {
    table.push_back({row.op, UnaryValidate, SameShape, UnaryReference, NoFlops});
  }
  table.push_back({"Clip", UnaryValidate, SameShape, UnaryReference, NoFlops});
  for (const BinaryRow& row : kBinary) {
    table.push_back({row.op, BinaryValidate, BroadcastAll, BinaryReference, NoFlops});
  }
  for (absl::string_view op :
       {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor"}) {
    table.push_back({op, CompareValidate, BroadcastAll, CompareReference, NoFlops});
  }
  table.push_back({"Not", CompareValidate, SameShape, CompareReference, NoFlops});
  table.push_back({"Where", WhereValidate, BroadcastAll, WhereReference, NoFlops});
}

}  // namespace numaserve::engine::ops
