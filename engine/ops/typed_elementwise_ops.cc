// Typed references of the element-wise ops, for nodes that read or write
// a runtime value other than FP32: the binary ops with numpy broadcasting
// (arithmetic, comparisons, logic), Pow, Where and the unary ops. They
// compute in the element's own type (INT64 exactly, integer division and
// powers wrapping like the type), FP16/BF16 in float rounded back, FP64 in
// double. typed_ops.cc attaches them to the registry (AddTypedOps).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"
#include "engine/ops/typed_util.h"
#include "kernels/ref/elementwise_ref.h"
#include "kernels/shape_ops.h"

namespace numaserve::engine::ops {
namespace {

// Integer power by squaring (exact, wrapping like the integer type);
// negative exponents through double.
template <typename B>
B IntPow(B base, int64_t e) {
  if (e < 0) return ConvertElement<B>(std::pow(static_cast<double>(base), static_cast<double>(e)));
  using U = std::make_unsigned_t<std::conditional_t<std::is_same_v<B, bool>, uint8_t, B>>;
  U r = 1, b = static_cast<U>(base);
  while (e > 0) {
    if (e & 1) r = static_cast<U>(r * b);
    b = static_cast<U>(b * b);
    e >>= 1;
  }
  return static_cast<B>(r);
}

enum class Bin {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kMod,
  kFmod,
  kMin,
  kMax,
  kEq,
  kLt,
  kLe,
  kGt,
  kGe,
  kAnd,
  kOr,
  kXor
};

absl::StatusOr<Bin> BinOf(const Node& node) {
  const std::string& op = node.op_type;
  if (op == "Add" || op == "Sum") return Bin::kAdd;
  if (op == "Sub") return Bin::kSub;
  if (op == "Mul") return Bin::kMul;
  if (op == "Div") return Bin::kDiv;
  if (op == "Mod") return node.GetInt("fmod", 0) != 0 ? Bin::kFmod : Bin::kMod;
  if (op == "Min") return Bin::kMin;
  if (op == "Max") return Bin::kMax;
  if (op == "Equal") return Bin::kEq;
  if (op == "Less") return Bin::kLt;
  if (op == "LessOrEqual") return Bin::kLe;
  if (op == "Greater") return Bin::kGt;
  if (op == "GreaterOrEqual") return Bin::kGe;
  if (op == "And") return Bin::kAnd;
  if (op == "Or") return Bin::kOr;
  if (op == "Xor") return Bin::kXor;
  return NodeUnsupported(node, "no typed binary implementation");
}

bool IsCompare(Bin b) { return b >= Bin::kEq && b <= Bin::kGe; }
bool IsLogic(Bin b) { return b >= Bin::kAnd; }

// Calls f(o, ia, ib) for every output element with numpy broadcasting.
template <typename F>
absl::StatusOr<Shape> ForBroadcast(const Node& node, const Shape& a, const Shape& b, F f) {
  auto shape = kernels::BroadcastShapes(a, b);
  if (!shape.ok()) return NodeError(node, shape.status().message());
  const std::vector<int64_t> oa = kernels::BroadcastOffsets(a, *shape);
  const std::vector<int64_t> ob = kernels::BroadcastOffsets(b, *shape);
  for (size_t i = 0; i < oa.size(); ++i) f(static_cast<int64_t>(i), oa[i], ob[i]);
  return *shape;
}

// A comparison or logical op on one pair of elements.
template <typename C>
bool CompareOrLogic(Bin op, C x, C z) {
  switch (op) {
    case Bin::kEq:
      return x == z;
    case Bin::kLt:
      return x < z;
    case Bin::kLe:
      return x <= z;
    case Bin::kGt:
      return x > z;
    case Bin::kGe:
      return x >= z;
    case Bin::kAnd:
      return x != C(0) && z != C(0);
    case Bin::kOr:
      return x != C(0) || z != C(0);
    case Bin::kXor:
      return (x != C(0)) != (z != C(0));
    default:
      return false;
  }
}

// An arithmetic op on one pair of integers: wrapping two's-complement
// arithmetic (no signed overflow UB); a zero divisor sets *div_by_zero.
template <typename C>
C IntegerArithmetic(Bin op, C x, C z, bool* div_by_zero) {
  using U = std::make_unsigned_t<C>;
  C r{};
  switch (op) {
    case Bin::kAdd:
      return static_cast<C>(static_cast<U>(x) + static_cast<U>(z));
    case Bin::kSub:
      return static_cast<C>(static_cast<U>(x) - static_cast<U>(z));
    case Bin::kMul:
      return static_cast<C>(static_cast<U>(x) * static_cast<U>(z));
    case Bin::kDiv:
      if (z == 0) {
        *div_by_zero = true;
      } else if constexpr (std::is_signed_v<C>) {
        r = (x == std::numeric_limits<C>::min() && z == C(-1)) ? x : static_cast<C>(x / z);
      } else {
        r = static_cast<C>(x / z);
      }
      return r;
    case Bin::kMod:
    case Bin::kFmod:
      if (z == 0) {
        *div_by_zero = true;
      } else if constexpr (std::is_signed_v<C>) {
        r = z == C(-1) ? C(0) : static_cast<C>(x % z);  // truncated (fmod=1)
        // fmod=0: the result takes the divisor's sign.
        if (op == Bin::kMod && r != 0 && ((r < 0) != (z < 0))) r = static_cast<C>(r + z);
      } else {
        r = static_cast<C>(x % z);
      }
      return r;
    case Bin::kMin:
      return std::min(x, z);
    case Bin::kMax:
      return std::max(x, z);
    default:
      return r;
  }
}

// An arithmetic op on one pair of floating-point values.
template <typename C>
C FloatArithmetic(Bin op, C x, C z) {
  switch (op) {
    case Bin::kAdd:
      return x + z;
    case Bin::kSub:
      return x - z;
    case Bin::kMul:
      return x * z;
    case Bin::kDiv:
      return x / z;
    case Bin::kMod:
    case Bin::kFmod:
      return std::fmod(x, z);
    // NaN propagates (ONNX Runtime's Min/Max).
    case Bin::kMin:
      return (std::isnan(x) || std::isnan(z)) ? C(NAN) : std::min(x, z);
    case Bin::kMax:
      return (std::isnan(x) || std::isnan(z)) ? C(NAN) : std::max(x, z);
    default:
      return C{};
  }
}

template <typename T>
absl::StatusOr<TypedTensor> BinaryOf(const Node& node, Bin op, const TypedTensor& a,
                                     const TypedTensor& b) {
  using C = Compute<T>;
  const DataType out_type = IsCompare(op) || IsLogic(op) ? DataType::kBool : a.type;
  auto shape = kernels::BroadcastShapes(a.shape, b.shape);
  if (!shape.ok()) return NodeError(node, shape.status().message());
  TypedTensor y(out_type, *shape);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  bool div_by_zero = false;
  (void)ForBroadcast(node, a.shape, b.shape, [&](int64_t i, int64_t ia, int64_t ib) {
    const C x = ToCompute(pa[ia]), z = ToCompute(pb[ib]);
    if (out_type == DataType::kBool) {
      y.data<bool>()[i] = CompareOrLogic(op, x, z);
      return;
    }
    C r{};
    if constexpr (std::is_same_v<T, bool>) {
      r = x;  // arithmetic on BOOL is refused at load
    } else if constexpr (std::is_integral_v<C>) {
      r = IntegerArithmetic(op, x, z, &div_by_zero);
    } else {
      r = FloatArithmetic(op, x, z);
    }
    y.data<T>()[i] = FromCompute<T>(r);
  });
  if (div_by_zero) {
    return NodeError(node, absl::StrCat("integer ", op == Bin::kDiv ? "division" : "modulo",
                                        " by zero (a divisor element is 0)"));
  }
  return y;
}

TypedOr BinaryTyped(const Graph&, const Node& node, const TypedIn& in) {
  auto op = BinOf(node);
  if (!op.ok()) return op.status();
  TypedTensor acc = *in[0];
  for (size_t i = 1; i < in.size(); ++i) {
    auto r = VisitType(
        in[0]->type,
        [&](auto tag) { return BinaryOf<typename decltype(tag)::type>(node, *op, acc, *in[i]); },
        [&]() -> absl::StatusOr<TypedTensor> { return Refuse(node, in[0]->type, "the input"); });
    if (!r.ok()) return r.status();
    acc = *std::move(r);
  }
  return OneT(std::move(acc));
}

absl::Status BinaryAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  auto op = BinOf(node);
  if (!op.ok()) return op.status();
  for (DataType t : in) {
    if (t != in[0]) return NodeError(node, "inputs differ in element type");
  }
  if (IsLogic(*op)) {
    if (in[0] != DataType::kBool) return Refuse(node, in[0], "a logical operand");
  } else if (!Numeric(in[0]) && !(*op == Bin::kEq && in[0] == DataType::kBool)) {
    return Refuse(node, in[0], "an operand");
  }
  const DataType want = IsCompare(*op) || IsLogic(*op) ? DataType::kBool : in[0];
  if (out[0] != want) return Refuse(node, out[0], "the output");
  return absl::OkStatus();
}

// Pow: output of the base's type; base and exponent of any numeric types.
template <typename B, typename E>
B PowElement(B base, E exponent) {
  if constexpr (std::is_integral_v<B> && std::is_integral_v<E>) {
    return IntPow<B>(base, static_cast<int64_t>(exponent));
  } else if constexpr (std::is_same_v<Compute<B>, float> && std::is_same_v<Compute<E>, float>) {
    return FromCompute<B>(std::pow(ToCompute(base), ToCompute(exponent)));
  } else {
    return ConvertElement<B>(
        std::pow(ConvertElement<double>(base), ConvertElement<double>(exponent)));
  }
}

TypedOr PowTyped(const Graph&, const Node& node, const TypedIn& in) {
  const TypedTensor& a = *in[0];
  const TypedTensor& b = *in[1];
  auto shape = kernels::BroadcastShapes(a.shape, b.shape);
  if (!shape.ok()) return NodeError(node, shape.status().message());
  TypedTensor y(a.type, *shape);
  VisitType(
      a.type,
      [&](auto base_tag) {
        using B = typename decltype(base_tag)::type;
        VisitType(
            b.type,
            [&](auto exp_tag) {
              using E = typename decltype(exp_tag)::type;
              const B* pa = a.data<B>();
              const E* pb = b.data<E>();
              B* py = y.data<B>();
              (void)ForBroadcast(node, a.shape, b.shape, [&](int64_t i, int64_t ia, int64_t ib) {
                py[i] = PowElement<B, E>(pa[ia], pb[ib]);
              });
            },
            [] {});
      },
      [] {});
  return OneT(std::move(y));
}

absl::Status PowAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  if (!Numeric(in[0])) return Refuse(node, in[0], "the base");
  if (!Numeric(in[1])) return Refuse(node, in[1], "the exponent");
  if (out[0] != in[0]) return Refuse(node, out[0], "the output");
  return absl::OkStatus();
}

// Where: BOOL condition, X and Y of one type, three-way broadcasting.
TypedOr WhereTyped(const Graph&, const Node& node, const TypedIn& in) {
  const TypedTensor& c = *in[0];
  const TypedTensor& x = *in[1];
  const TypedTensor& z = *in[2];
  auto s1 = kernels::BroadcastShapes(c.shape, x.shape);
  if (!s1.ok()) return NodeError(node, s1.status().message());
  auto shape = kernels::BroadcastShapes(*s1, z.shape);
  if (!shape.ok()) return NodeError(node, shape.status().message());
  const auto oc = kernels::BroadcastOffsets(c.shape, *shape);
  const auto ox = kernels::BroadcastOffsets(x.shape, *shape);
  const auto oz = kernels::BroadcastOffsets(z.shape, *shape);
  const TypedTensor cond = c.type == DataType::kBool ? c : c.CastTo(DataType::kBool);
  TypedTensor y(x.type, *shape);
  const size_t es = x.element_size();
  for (size_t i = 0; i < oc.size(); ++i) {
    const bool pick_x = cond.data<bool>()[oc[i]];
    std::memcpy(y.bytes.data() + i * es, pick_x ? x.raw() + ox[i] * es : z.raw() + oz[i] * es, es);
  }
  return OneT(std::move(y));
}

absl::Status WhereAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  if (in[0] != DataType::kBool) return Refuse(node, in[0], "the condition");
  if (in[1] != in[2] || out[0] != in[1])
    return NodeError(node, "X, Y and the output differ in type");
  return absl::OkStatus();
}

// Unary: Abs, Neg, Relu, Sign, Not, Clip (bounds of the input's type).
template <typename T>
void UnaryOf(const Node& node, const TypedTensor& x, const TypedTensor* lo, const TypedTensor* hi,
             TypedTensor& y) {
  using C = Compute<T>;
  const T* px = x.data<T>();
  T* py = y.data<T>();
  const std::string& op = node.op_type;
  C min_v = std::numeric_limits<C>::lowest(), max_v = std::numeric_limits<C>::max();
  if constexpr (!std::is_integral_v<C>) {
    min_v = -std::numeric_limits<C>::infinity();
    max_v = std::numeric_limits<C>::infinity();
  }
  if (lo != nullptr && lo->size() > 0) min_v = ToCompute(lo->CastTo(x.type).template data<T>()[0]);
  if (hi != nullptr && hi->size() > 0) max_v = ToCompute(hi->CastTo(x.type).template data<T>()[0]);
  for (int64_t i = 0; i < x.size(); ++i) {
    const C v = ToCompute(px[i]);
    C r = v;
    if constexpr (std::is_same_v<C, bool>) {
      if (op == "Not") r = !v;
    } else {
      if (op == "Abs") {
        if constexpr (std::is_signed_v<C> || !std::is_integral_v<C>) r = v < C(0) ? C(-v) : v;
      } else if (op == "Neg") {
        if constexpr (std::is_integral_v<C>) {
          r = static_cast<C>(C(0) - v);
        } else {
          r = -v;
        }
      } else if (op == "Relu") {
        r = v < C(0) ? C(0) : v;
      } else if (op == "Sign") {
        r = v > C(0) ? C(1) : (v < C(0) ? C(-1) : C(0));
      } else if (op == "Clip") {
        r = v < min_v ? min_v : (v > max_v ? max_v : v);
      }
    }
    py[i] = FromCompute<T>(r);
  }
}

TypedOr UnaryTyped(const Graph&, const Node& node, const TypedIn& in) {
  TypedTensor y(in[0]->type, in[0]->shape);
  const TypedTensor* lo = in.size() > 1 ? in[1] : nullptr;
  const TypedTensor* hi = in.size() > 2 ? in[2] : nullptr;
  // Clip's attribute bounds (before opset 11) are floats.
  TypedTensor lo_attr, hi_attr;
  if (node.op_type == "Clip" && lo == nullptr && node.HasAttribute("min")) {
    lo_attr = TypedTensor::FromFloat(kernels::Tensor(Shape{}, {node.GetFloat("min", 0)}));
    lo = &lo_attr;
  }
  if (node.op_type == "Clip" && hi == nullptr && node.HasAttribute("max")) {
    hi_attr = TypedTensor::FromFloat(kernels::Tensor(Shape{}, {node.GetFloat("max", 0)}));
    hi = &hi_attr;
  }
  VisitType(
      in[0]->type,
      [&](auto tag) { UnaryOf<typename decltype(tag)::type>(node, *in[0], lo, hi, y); }, [] {});
  return OneT(std::move(y));
}

absl::Status UnaryAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  if (node.op_type == "Not") {
    if (in[0] != DataType::kBool) return Refuse(node, in[0], "the input");
  } else if (!Numeric(in[0])) {
    return Refuse(node, in[0], "the input");
  }
  for (size_t i = 1; i < in.size(); ++i) {
    if (HasInput(node, i) && in[i] != in[0]) return NodeError(node, "min/max differ in type");
  }
  if (out[0] != in[0]) return Refuse(node, out[0], "the output");
  return absl::OkStatus();
}

const TypedRow kElementwiseRows[] = {
    {"Add", BinaryTyped, BinaryAccepts},
    {"Sub", BinaryTyped, BinaryAccepts},
    {"Mul", BinaryTyped, BinaryAccepts},
    {"Div", BinaryTyped, BinaryAccepts},
    {"Mod", BinaryTyped, BinaryAccepts},
    {"Min", BinaryTyped, BinaryAccepts},
    {"Max", BinaryTyped, BinaryAccepts},
    {"Sum", BinaryTyped, BinaryAccepts},
    {"Equal", BinaryTyped, BinaryAccepts},
    {"Less", BinaryTyped, BinaryAccepts},
    {"LessOrEqual", BinaryTyped, BinaryAccepts},
    {"Greater", BinaryTyped, BinaryAccepts},
    {"GreaterOrEqual", BinaryTyped, BinaryAccepts},
    {"And", BinaryTyped, BinaryAccepts},
    {"Or", BinaryTyped, BinaryAccepts},
    {"Xor", BinaryTyped, BinaryAccepts},
    {"Pow", PowTyped, PowAccepts},
    {"Where", WhereTyped, WhereAccepts},
    {"Abs", UnaryTyped, UnaryAccepts},
    {"Neg", UnaryTyped, UnaryAccepts},
    {"Relu", UnaryTyped, UnaryAccepts},
    {"Sign", UnaryTyped, UnaryAccepts},
    {"Clip", UnaryTyped, UnaryAccepts},
    {"Not", UnaryTyped, UnaryAccepts},
};

}  // namespace

absl::Span<const TypedRow> TypedElementwiseRows() { return kElementwiseRows; }

}  // namespace numaserve::engine::ops
