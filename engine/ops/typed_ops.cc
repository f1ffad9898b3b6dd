// Typed references: the ops that run on values of any supported element
// type (engine/typed_tensor.h), for nodes that read or write a runtime
// value other than FP32; also the CastLike, QuantizeLinear and
// DequantizeLinear rows. Numeric ops compute in the element's own type
// (INT64 exactly), FP16/BF16 in float rounded back, FP64 in double.
// Data-movement ops run the FP32 reference on the positions of the
// elements and move the typed elements to where their positions landed
// (exact at any size: from 2^24 elements the positions go through two
// passes of 12-bit halves).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"
#include "kernels/ref/elementwise_ref.h"
#include "kernels/shape_ops.h"

namespace numaserve::engine::ops {
namespace {

using TypedOr = absl::StatusOr<std::vector<TypedTensor>>;
using TypedIn = std::vector<const TypedTensor*>;
using Types = std::vector<DataType>;

TypedOr OneT(TypedTensor t) {
  std::vector<TypedTensor> out;
  out.push_back(std::move(t));
  return out;
}

bool Known(DataType t) { return t != DataType::kUnknown; }
bool Numeric(DataType t) { return IsIntegerType(t) || IsFloatType(t); }

absl::Status Refuse(const Node& node, DataType type, absl::string_view what) {
  return NodeUnsupported(
      node, absl::StrCat(what, " of type ", DataTypeName(type), " has no typed implementation"));
}

// Every present input and every output of a type the engine knows.
absl::Status AllKnown(const Node& node, const Types& in, const Types& out) {
  for (size_t i = 0; i < in.size(); ++i) {
    if (HasInput(node, i) && !Known(in[i])) return Refuse(node, in[i], "an input");
  }
  for (DataType t : out) {
    if (!Known(t)) return Refuse(node, t, "an output");
  }
  return absl::OkStatus();
}

// --- Data movement through element positions --------------------------------

constexpr int64_t kExactFloatPositions = int64_t{1} << 24;
constexpr int64_t kHalfBits = 12;

// Runs `node`'s FP32 reference with the inputs in `data_inputs` replaced by
// their elements' positions (counted across those inputs in order) and the
// others by their FP32 values; returns per output its shape and, per
// element, the position it came from (negative: a fill value).
absl::StatusOr<std::vector<std::pair<Shape, std::vector<int64_t>>>> MovePositions(
    const Graph& graph, const Node& node, const TypedIn& in,
    const std::vector<size_t>& data_inputs) {
  const OpSchema* schema = FindOpSchema(node.op_type);
  int64_t total = 0;
  for (size_t k : data_inputs) total += in[k]->size();
  const bool split = total >= kExactFloatPositions;
  if (total >= (kExactFloatPositions << kHalfBits)) {
    return NodeUnsupported(node, absl::StrCat(total, " elements are too many to move"));
  }
  std::vector<kernels::Tensor> others(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != nullptr &&
        std::find(data_inputs.begin(), data_inputs.end(), i) == data_inputs.end()) {
      others[i] = in[i]->ToFloat();
    }
  }
  std::vector<std::pair<Shape, std::vector<int64_t>>> result;
  for (int pass = 0; pass < (split ? 2 : 1); ++pass) {
    std::vector<kernels::Tensor> positions(in.size());
    std::vector<const kernels::Tensor*> args(in.size(), nullptr);
    int64_t offset = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i] == nullptr) continue;
      if (std::find(data_inputs.begin(), data_inputs.end(), i) == data_inputs.end()) {
        args[i] = &others[i];
        continue;
      }
      positions[i] = kernels::Tensor(in[i]->shape);
      for (int64_t j = 0; j < in[i]->size(); ++j) {
        const int64_t p = offset + j;
        positions[i].data[j] = static_cast<float>(
            !split ? p : (pass == 0 ? p & ((1 << kHalfBits) - 1) : p >> kHalfBits));
      }
      offset += in[i]->size();
      args[i] = &positions[i];
    }
    auto out = schema->reference(graph, node, args);
    if (!out.ok()) return out.status();
    if (pass == 0) result.resize(out->size());
    for (size_t j = 0; j < out->size(); ++j) {
      const kernels::Tensor& t = (*out)[j];
      if (pass == 0) {
        result[j].first = t.shape;
        result[j].second.resize(t.data.size());
      }
      for (size_t e = 0; e < t.data.size(); ++e) {
        const int64_t v = static_cast<int64_t>(t.data[e]);
        int64_t& p = result[j].second[e];
        if (!split || pass == 0) {
          p = v;  // the value, or its low half (or -1)
        } else {
          p = (v < 0 || p < 0) ? -1 : (v << kHalfBits) + p;
        }
      }
    }
  }
  return result;
}

// Typed outputs from positions into the data inputs; `fill` (one element,
// or null for zero) where a position is negative.
TypedOr GatherPositions(const Node& node, const TypedIn& in, const std::vector<size_t>& data_inputs,
                        const std::vector<std::pair<Shape, std::vector<int64_t>>>& moved,
                        const TypedTensor* fill) {
  const DataType type = in[data_inputs[0]]->type;
  const size_t es = DataTypeSize(type);
  std::vector<const uint8_t*> base;
  std::vector<int64_t> starts;
  int64_t total = 0;
  for (size_t k : data_inputs) {
    if (in[k]->type != type) return NodeError(node, "data inputs differ in element type");
    base.push_back(in[k]->raw());
    starts.push_back(total);
    total += in[k]->size();
  }
  std::vector<TypedTensor> out;
  for (const auto& [shape, positions] : moved) {
    TypedTensor t(type, shape);
    for (size_t e = 0; e < positions.size(); ++e) {
      const int64_t p = positions[e];
      uint8_t* dst = t.bytes.data() + e * es;
      if (p < 0 || p >= total) {
        if (fill != nullptr && fill->size() > 0) std::memcpy(dst, fill->raw(), es);
        continue;
      }
      const size_t k = std::upper_bound(starts.begin(), starts.end(), p) - starts.begin() - 1;
      std::memcpy(dst, base[k] + (p - starts[k]) * es, es);
    }
    out.push_back(std::move(t));
  }
  return out;
}

TypedOr MoveReference(const Graph& graph, const Node& node, const TypedIn& in) {
  std::vector<size_t> data_inputs = {0};
  if (node.op_type == "Concat") {
    data_inputs.clear();
    for (size_t i = 0; i < in.size(); ++i) data_inputs.push_back(i);
  }
  auto moved = MovePositions(graph, node, in, data_inputs);
  if (!moved.ok()) return moved.status();
  return GatherPositions(node, in, data_inputs, *moved, nullptr);
}

// Data inputs any type; the others (indices, shapes, axes) read as today.
absl::Status MoveAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  for (size_t j = 0; j < out.size(); ++j) {
    if (out[j] != in[0]) return NodeError(node, "output type differs from the input's");
  }
  return absl::OkStatus();
}

// Pad: the constant value (input 2 or attribute) in the data's type.
TypedOr PadTyped(const Graph& graph, const Node& node, const TypedIn& in) {
  Node marked = node;
  if (marked.inputs.size() > 2) marked.inputs.resize(2);
  marked.attributes["value"] = -1.0f;
  TypedIn args(in.begin(), in.begin() + std::min<size_t>(in.size(), 2));
  auto moved = MovePositions(graph, marked, args, {0});
  if (!moved.ok()) return moved.status();
  TypedTensor fill(in[0]->type, Shape{});
  if (in.size() > 2 && in[2] != nullptr && in[2]->size() > 0) {
    fill = TypedTensor::FromBytes(in[2]->type, Shape{}, in[2]->raw()).CastTo(in[0]->type);
  } else {
    const kernels::Tensor v(Shape{}, {node.GetFloat("value", 0.0f)});
    fill = TypedTensor::FromFloat(v).CastTo(in[0]->type);
  }
  return GatherPositions(node, in, {0}, *moved, &fill);
}

// Views and copies: the data under the inferred shape.
TypedOr ViewTyped(const Graph& graph, const Node& node, const TypedIn& in) {
  std::vector<const Shape*> shapes;
  for (const TypedTensor* t : in) shapes.push_back(t != nullptr ? &t->shape : nullptr);
  auto out = FindOpSchema(node.op_type)->infer_shapes(graph, node, shapes);
  if (!out.ok()) return out.status();
  TypedTensor y = *in[0];
  y.shape = (*out)[0];
  if (node.op_type != "Dropout" || node.outputs.size() < 2) return OneT(std::move(y));
  TypedTensor mask(DataType::kBool, in[0]->shape);
  std::fill(mask.bytes.begin(), mask.bytes.end(), uint8_t{1});
  std::vector<TypedTensor> both;
  both.push_back(std::move(y));
  both.push_back(std::move(mask));
  return both;
}

absl::Status DropoutAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  if (out[0] != in[0] || (out.size() > 1 && out[1] != DataType::kBool)) {
    return NodeError(node, "output types must be the input's and BOOL");
  }
  return absl::OkStatus();
}

// --- Gather with runtime indices ----------------------------------------------

TypedOr GatherTyped(const Graph& graph, const Node& node, const TypedIn& in) {
  if (graph.IsConstant(node.inputs[1])) return MoveReference(graph, node, in);
  const TypedTensor& x = *in[0];
  const TypedTensor& idx = *in[1];
  auto axis = kernels::NormalizeAxis(node.GetInt("axis", 0), static_cast<int64_t>(x.shape.size()));
  if (!axis.ok()) return NodeError(node, axis.status().message());
  Shape out_shape(x.shape.begin(), x.shape.begin() + *axis);
  out_shape.insert(out_shape.end(), idx.shape.begin(), idx.shape.end());
  out_shape.insert(out_shape.end(), x.shape.begin() + *axis + 1, x.shape.end());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < *axis; ++d) outer *= x.shape[d];
  for (size_t d = *axis + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
  const int64_t dim = x.shape[*axis];
  const int64_t n = idx.size();
  const size_t es = x.element_size();
  TypedTensor y(x.type, out_shape);
  for (int64_t i = 0; i < n; ++i) {
    int64_t k = idx.GetInt64(i);
    if (k < 0) k += dim;
    if (k < 0 || k >= dim) {
      return NodeError(
          node, absl::StrCat("index ", idx.GetInt64(i), " is out of range for dim ", dim,
                             " (element ", i, " of '", graph.value(node.inputs[1]).name, "')"));
    }
    // No elements: nothing to copy (and `outer` alone may be huge).
    for (int64_t o = 0; o < outer && !y.bytes.empty(); ++o) {
      std::memcpy(y.bytes.data() + ((o * n + i) * inner) * es,
                  x.raw() + ((o * dim + k) * inner) * es, inner * es);
    }
  }
  return OneT(std::move(y));
}

absl::Status GatherAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  if (in[1] != DataType::kInt64 && in[1] != DataType::kInt32) {
    return Refuse(node, in[1], "indices");
  }
  if (out[0] != in[0]) return NodeError(node, "output type differs from the data's");
  return absl::OkStatus();
}

// --- Cast, Shape, Size, ConstantOfShape -------------------------------------------

absl::StatusOr<DataType> CastTarget(const Node& node);

TypedOr CastTyped(const Graph&, const Node& node, const TypedIn& in) {
  auto to = CastTarget(node);
  if (!to.ok()) return to.status();
  return OneT(in[0]->CastTo(*to));
}

absl::Status CastAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  auto to = CastTarget(node);
  if (!to.ok()) return to.status();
  if (out[0] != *to) return NodeError(node, "output type differs from 'to'");
  return absl::OkStatus();
}

TypedOr ShapeTyped(const Graph&, const Node& node, const TypedIn& in) {
  const int64_t rank = static_cast<int64_t>(in[0]->shape.size());
  int64_t start = node.GetInt("start", 0), end = node.GetInt("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::max(start, std::clamp<int64_t>(end, 0, rank));
  std::vector<int64_t> dims(in[0]->shape.begin() + start, in[0]->shape.begin() + end);
  return OneT(TypedTensor::FromValues(DataType::kInt64, Shape{end - start}, dims));
}

TypedOr SizeTyped(const Graph&, const Node&, const TypedIn& in) {
  return OneT(
      TypedTensor::FromValues(DataType::kInt64, Shape{}, std::vector<int64_t>{in[0]->size()}));
}

absl::Status Int64Output(const Node& node, const Types& in, const Types& out) {
  if (!Known(in[0])) return Refuse(node, in[0], "the input");
  if (out[0] != DataType::kInt64) return Refuse(node, out[0], "the output");
  return absl::OkStatus();
}

TypedOr ConstantOfShapeTyped(const Graph& graph, const Node& node, const TypedIn& in) {
  std::vector<int64_t> shape;
  for (int64_t i = 0; i < in[0]->size(); ++i) shape.push_back(in[0]->GetInt64(i));
  if (absl::Status s = CheckShape(node, shape, "the shape input"); !s.ok()) return s;
  const DataType type = graph.value(node.outputs[0]).type == DataType::kUnknown
                            ? DataType::kFloat32
                            : graph.value(node.outputs[0]).type;
  TypedTensor y(type, shape);
  auto it = node.tensor_attributes.find("value");
  if (it != node.tensor_attributes.end() && kernels::NumElements(it->second.shape) == 1) {
    const Constant& c = it->second;
    TypedTensor v = c.type == DataType::kFloat32
                        ? TypedTensor::FromFloat(c.f32)
                        : TypedTensor::FromBytes(c.type, Shape{}, c.bytes.data());
    v = v.CastTo(type);
    const size_t es = DataTypeSize(type);
    for (int64_t i = 0; i < y.size(); ++i) std::memcpy(y.bytes.data() + i * es, v.raw(), es);
  }
  return OneT(std::move(y));
}

absl::Status ConstantOfShapeAccepts(const Node& node, const Types& in, const Types& out) {
  if (in[0] != DataType::kInt64) return Refuse(node, in[0], "the shape");
  if (!Known(out[0])) return Refuse(node, out[0], "the output");
  return absl::OkStatus();
}

// --- Element-wise -----------------------------------------------------------------

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
      bool r = false;
      switch (op) {
        case Bin::kEq:
          r = x == z;
          break;
        case Bin::kLt:
          r = x < z;
          break;
        case Bin::kLe:
          r = x <= z;
          break;
        case Bin::kGt:
          r = x > z;
          break;
        case Bin::kGe:
          r = x >= z;
          break;
        case Bin::kAnd:
          r = x != C(0) && z != C(0);
          break;
        case Bin::kOr:
          r = x != C(0) || z != C(0);
          break;
        case Bin::kXor:
          r = (x != C(0)) != (z != C(0));
          break;
        default:
          break;
      }
      y.data<bool>()[i] = r;
      return;
    }
    C r{};
    if constexpr (std::is_same_v<T, bool>) {
      r = x;  // arithmetic on BOOL is refused at load
    } else if constexpr (std::is_integral_v<C>) {
      using U = std::make_unsigned_t<C>;
      switch (op) {
        // Wrapping two's-complement arithmetic (no signed overflow UB).
        case Bin::kAdd:
          r = static_cast<C>(static_cast<U>(x) + static_cast<U>(z));
          break;
        case Bin::kSub:
          r = static_cast<C>(static_cast<U>(x) - static_cast<U>(z));
          break;
        case Bin::kMul:
          r = static_cast<C>(static_cast<U>(x) * static_cast<U>(z));
          break;
        case Bin::kDiv:
          if (z == 0) {
            div_by_zero = true;
          } else if constexpr (std::is_signed_v<C>) {
            r = (x == std::numeric_limits<C>::min() && z == C(-1)) ? x : static_cast<C>(x / z);
          } else {
            r = static_cast<C>(x / z);
          }
          break;
        case Bin::kMod:
        case Bin::kFmod:
          if (z == 0) {
            div_by_zero = true;
          } else if constexpr (std::is_signed_v<C>) {
            r = z == C(-1) ? C(0) : static_cast<C>(x % z);  // truncated (fmod=1)
            // fmod=0: the result takes the divisor's sign.
            if (op == Bin::kMod && r != 0 && ((r < 0) != (z < 0))) r = static_cast<C>(r + z);
          } else {
            r = static_cast<C>(x % z);
          }
          break;
        case Bin::kMin:
          r = std::min(x, z);
          break;
        case Bin::kMax:
          r = std::max(x, z);
          break;
        default:
          break;
      }
    } else {
      switch (op) {
        case Bin::kAdd:
          r = x + z;
          break;
        case Bin::kSub:
          r = x - z;
          break;
        case Bin::kMul:
          r = x * z;
          break;
        case Bin::kDiv:
          r = x / z;
          break;
        case Bin::kMod:
        case Bin::kFmod:
          r = std::fmod(x, z);
          break;
        // NaN propagates (ONNX Runtime's Min/Max).
        case Bin::kMin:
          r = (std::isnan(x) || std::isnan(z)) ? C(NAN) : std::min(x, z);
          break;
        case Bin::kMax:
          r = (std::isnan(x) || std::isnan(z)) ? C(NAN) : std::max(x, z);
          break;
        default:
          break;
      }
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

// --- MaxPool (and its INT64 Indices) ---------------------------------------------

template <typename T>
void MaxPoolOf(const TypedTensor& x, const kernels::WindowParams& p, int64_t storage_order,
               TypedTensor& y, TypedTensor* indices) {
  using C = Compute<T>;
  const size_t spatial = p.kernel.size();
  const Shape& xs = x.shape;
  const Shape& ys = y.shape;
  int64_t in_plane = 1, out_plane = 1;
  for (size_t d = 0; d < spatial; ++d) {
    in_plane *= xs[d + 2];
    out_plane *= ys[d + 2];
  }
  const T* px = x.data<T>();
  T* py = y.data<T>();
  const int64_t planes = xs[0] * xs[1];
  std::vector<int64_t> o(spatial), k(spatial), pos(spatial);
  int64_t window = 1;
  for (int64_t e : p.kernel) window *= e;
  for (int64_t plane = 0; plane < planes; ++plane) {
    for (int64_t oi = 0; oi < out_plane; ++oi) {
      int64_t rem = oi;
      for (size_t d = spatial; d-- > 0;) {
        o[d] = rem % ys[d + 2];
        rem /= ys[d + 2];
      }
      bool any = false;
      C best{};
      int64_t best_index = 0;
      for (int64_t ki = 0; ki < window; ++ki) {
        int64_t r = ki;
        bool inside = true;
        for (size_t d = spatial; d-- > 0;) {
          k[d] = r % p.kernel[d];
          r /= p.kernel[d];
          pos[d] = o[d] * p.strides[d] - p.pads_begin[d] + k[d] * p.dilations[d];
          inside = inside && pos[d] >= 0 && pos[d] < xs[d + 2];
        }
        if (!inside) continue;
        int64_t row_major = 0;
        for (size_t d = 0; d < spatial; ++d) row_major = row_major * xs[d + 2] + pos[d];
        const C v = ToCompute(px[plane * in_plane + row_major]);
        if (!any || v > best) {
          any = true;
          best = v;
          int64_t index = row_major;
          if (storage_order != 0) {  // column-major over the spatial dims
            index = 0;
            for (size_t d = spatial; d-- > 0;) index = index * xs[d + 2] + pos[d];
          }
          best_index = plane * in_plane + index;
        }
      }
      if (!any) {
        if constexpr (std::is_integral_v<C>) {
          best = std::numeric_limits<C>::lowest();
        } else {
          best = -std::numeric_limits<C>::infinity();
        }
      }
      py[plane * out_plane + oi] = FromCompute<T>(best);
      if (indices != nullptr) indices->data<int64_t>()[plane * out_plane + oi] = best_index;
    }
  }
}

TypedOr MaxPoolTyped(const Graph& graph, const Node& node, const TypedIn& in) {
  const TypedTensor& x = *in[0];
  auto p = ResolveWindow(node, x.shape, node.GetInts("kernel_shape", {}));
  if (!p.ok()) return p.status();
  auto shapes = FindOpSchema("MaxPool")->infer_shapes(graph, node, {&x.shape});
  if (!shapes.ok()) return shapes.status();
  std::vector<TypedTensor> out;
  out.emplace_back(x.type, (*shapes)[0]);
  if (node.outputs.size() > 1) out.emplace_back(DataType::kInt64, (*shapes)[0]);
  TypedTensor* indices = node.outputs.size() > 1 ? &out[1] : nullptr;
  const int64_t storage_order = node.GetInt("storage_order", 0);
  VisitType(
      x.type,
      [&](auto tag) {
        MaxPoolOf<typename decltype(tag)::type>(x, *p, storage_order, out[0], indices);
      },
      [] {});
  return out;
}

absl::Status MaxPoolAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  if (!Numeric(in[0])) return Refuse(node, in[0], "the input");
  if (out[0] != in[0]) return Refuse(node, out[0], "the output");
  if (out.size() > 1 && out[1] != DataType::kInt64) return Refuse(node, out[1], "Indices");
  return absl::OkStatus();
}

// --- ReduceSum / ReduceMax / ReduceMin -------------------------------------------------

template <typename T>
void ReduceOf(const std::string& op, const TypedTensor& x, const std::vector<bool>& reduced,
              TypedTensor& y) {
  using C = Compute<T>;
  const Shape& s = x.shape;
  const size_t rank = s.size();
  // Output index of each input element: the kept dims, row-major.
  std::vector<bool> seen(y.size(), false);
  std::vector<C> acc(y.size(), C{});
  std::vector<int64_t> idx(rank, 0);
  const T* px = x.data<T>();
  for (int64_t i = 0; i < x.size(); ++i) {
    int64_t out = 0;
    for (size_t d = 0; d < rank; ++d) {
      if (!reduced[d]) out = out * s[d] + idx[d];
    }
    const C v = ToCompute(px[i]);
    if (op == "ReduceSum") {
      if constexpr (std::is_integral_v<C> && !std::is_same_v<C, bool>) {
        using U = std::make_unsigned_t<C>;
        acc[out] = static_cast<C>(static_cast<U>(acc[out]) + static_cast<U>(v));
      } else {
        acc[out] = acc[out] + v;
      }
    } else if (!seen[out] || (op == "ReduceMax" ? v > acc[out] : v < acc[out])) {
      acc[out] = v;
    }
    seen[out] = true;
    for (size_t d = rank; d-- > 0;) {
      if (++idx[d] < s[d]) break;
      idx[d] = 0;
    }
  }
  for (int64_t i = 0; i < y.size(); ++i) y.data<T>()[i] = FromCompute<T>(acc[i]);
}

TypedOr ReduceTyped(const Graph& graph, const Node& node, const TypedIn& in) {
  const TypedTensor& x = *in[0];
  auto shapes = FindOpSchema(node.op_type)->infer_shapes(graph, node, {&x.shape});
  if (!shapes.ok()) return shapes.status();
  auto axes = IntsFromAttrOrInput(graph, node, "axes", 1);
  if (!axes.ok()) return axes.status();
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  std::vector<bool> reduced(rank, false);
  if (axes->has_value() && !(*axes)->empty()) {
    auto norm = NormalizeAxes(node, **axes, rank);
    if (!norm.ok()) return norm.status();
    for (int64_t a : *norm) reduced[a] = true;
  } else if (node.GetInt("noop_with_empty_axes", 0) == 0) {
    reduced.assign(rank, true);
  }
  TypedTensor y(x.type, (*shapes)[0]);
  VisitType(
      x.type,
      [&](auto tag) { ReduceOf<typename decltype(tag)::type>(node.op_type, x, reduced, y); },
      [] {});
  return OneT(std::move(y));
}

absl::Status ReduceAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  if (!Numeric(in[0])) return Refuse(node, in[0], "the input");
  if (out[0] != in[0]) return Refuse(node, out[0], "the output");
  return absl::OkStatus();
}

absl::StatusOr<DataType> CastTarget(const Node& node) {
  const int64_t to = node.GetInt("to", 0);
  // ONNX TensorProto.DataType numbers.
  switch (to) {
    case 1:
      return DataType::kFloat32;
    case 2:
      return DataType::kUint8;
    case 3:
      return DataType::kInt8;
    case 4:
      return DataType::kUint16;
    case 5:
      return DataType::kInt16;
    case 6:
      return DataType::kInt32;
    case 7:
      return DataType::kInt64;
    case 9:
      return DataType::kBool;
    case 10:
      return DataType::kFloat16;
    case 11:
      return DataType::kFloat64;
    case 12:
      return DataType::kUint32;
    case 13:
      return DataType::kUint64;
    case 16:
      return DataType::kBFloat16;
    default:
      return NodeUnsupported(node, absl::StrCat("cast to element type ", to,
                                                " (STRING and other non-numeric types) is not "
                                                "supported"));
  }
}

// CastLike: Cast to the element type of input 1 (only its type is read).
absl::Status CastLikeValidate(const Graph&, const Node& node) {
  if (absl::Status s = CheckArity(node, 2, 2); !s.ok()) return s;
  if (node.inputs[1] == kNoValue) return NodeError(node, "target_type (input 1) is required");
  return absl::OkStatus();
}

// Both FP32: a copy.
TensorsOr CastLikeReference(const Graph&, const Node&, const std::vector<const Tensor*>& in) {
  return One(*in[0]);
}

TypedOr CastLikeTyped(const Graph&, const Node&, const TypedIn& in) {
  return OneT(in[0]->CastTo(in[1]->type));
}

absl::Status CastLikeAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  if (out[0] != in[1]) return NodeError(node, "output type differs from target_type's");
  return absl::OkStatus();
}

// --- QuantizeLinear, DequantizeLinear -----------------------------------------------
//
// ONNX semantics (opsets 10, 13, 19, 21): a per-tensor scale (a scalar or one
// value) or a per-axis one (1-D, one value per element of x along `axis`,
// default 1); the zero point optional, of the quantized type, shaped as the
// scale. QuantizeLinear: y = saturate(round_half_to_even(x / scale) + zp)
// with x / scale in float (scale 0 gives inf or NaN; NaN becomes 0, as ONNX
// Runtime does), into UINT8 (the default), INT8, UINT16 or INT16.
// DequantizeLinear: y = float(x - zp) * scale for INT8, UINT8, INT16, UINT16
// and INT32 (zero point 0) x, of the scale's type. Blocked quantization
// (block_size) and the FLOAT8/INT4/FLOAT4 types are refused as unsupported.

bool IsQuantizedType(DataType t) {
  return t == DataType::kUint8 || t == DataType::kInt8 || t == DataType::kUint16 ||
         t == DataType::kInt16;
}
bool IsScaleType(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat16 || t == DataType::kBFloat16;
}
bool IsDequantizableType(DataType t) { return IsQuantizedType(t) || t == DataType::kInt32; }

// An input's element type as the graph has it: the constant's (kUnknown for
// an initializer of a type the engine has no DataType for, e.g. FLOAT8), else
// the runtime type (FP32 where unknown).
DataType GraphTypeOf(const Graph& graph, ValueId v) {
  if (v == kNoValue) return DataType::kUnknown;
  if (const Constant* c = graph.FindConstant(v); c != nullptr) return c->type;
  const DataType t = graph.value(v).type;
  return t == DataType::kUnknown ? DataType::kFloat32 : t;
}

// QuantizeLinear's output_dtype attribute (opset 21): kUnknown when unset
// (0); an UNIMPLEMENTED naming the type for FLOAT8/INT4/FLOAT4.
absl::StatusOr<DataType> QuantizeOutputDtype(const Node& node) {
  const int64_t t = node.GetInt("output_dtype", 0);
  switch (t) {
    case 0:
      return DataType::kUnknown;
    case 2:
      return DataType::kUint8;
    case 3:
      return DataType::kInt8;
    case 4:
      return DataType::kUint16;
    case 5:
      return DataType::kInt16;
    case 17:
    case 18:
    case 19:
    case 20:
      return NodeUnsupported(node, absl::StrCat("output_dtype ", t,
                                                " (a FLOAT8 type) is not supported; "
                                                "UINT8, INT8, UINT16 and INT16 are"));
    case 21:
    case 22:
    case 23:
      return NodeUnsupported(node, absl::StrCat("output_dtype ", t,
                                                " (INT4/UINT4/FLOAT4) is not supported; "
                                                "UINT8, INT8, UINT16 and INT16 are"));
    default:
      return NodeError(node, absl::StrCat("output_dtype ", t, " is not a quantized type"));
  }
}

// Checks the element types of a QuantizeLinear or DequantizeLinear: x, the
// scale, the zero point (kUnknown when omitted) and the output (kUnknown
// when not known yet). The output type is returned.
absl::StatusOr<DataType> QdqTypes(const Node& node, DataType x, DataType scale, DataType zp,
                                  bool has_zp, DataType out) {
  const bool quantize = node.op_type == "QuantizeLinear";
  const char* kUnknownType =
      " has an element type the engine does not support (FLOAT8, INT4, FLOAT4 or another type "
      "without a DataType)";
  if (x == DataType::kUnknown) return NodeUnsupported(node, absl::StrCat("x", kUnknownType));
  if (scale == DataType::kUnknown) {
    return NodeUnsupported(node, absl::StrCat("the scale", kUnknownType));
  }
  if (has_zp && zp == DataType::kUnknown) {
    return NodeUnsupported(node, absl::StrCat("the zero point", kUnknownType));
  }
  if (!IsScaleType(scale)) {
    return NodeError(node, absl::StrCat("the scale is ", DataTypeName(scale),
                                        "; it must be FP32, FP16 or BF16"));
  }
  DataType want;
  if (quantize) {
    if (!IsScaleType(x) && x != DataType::kInt32) {
      return NodeError(node, absl::StrCat("x is ", DataTypeName(x),
                                          "; QuantizeLinear reads FP32, FP16, BF16 or INT32"));
    }
    auto dtype = QuantizeOutputDtype(node);
    if (!dtype.ok()) return dtype.status();
    want = has_zp ? zp : (*dtype != DataType::kUnknown ? *dtype : DataType::kUint8);
    if (!IsQuantizedType(want)) {
      return NodeError(node, absl::StrCat("the zero point is ", DataTypeName(want),
                                          "; it must be UINT8, INT8, UINT16 or INT16"));
    }
    if (*dtype != DataType::kUnknown && *dtype != want) {
      return NodeError(node, absl::StrCat("output_dtype is ", DataTypeName(*dtype),
                                          " but the zero point is ", DataTypeName(want)));
    }
  } else {
    if (!IsDequantizableType(x)) {
      return NodeError(node, absl::StrCat("x is ", DataTypeName(x),
                                          "; DequantizeLinear reads INT8, UINT8, INT16, UINT16 "
                                          "or INT32"));
    }
    if (has_zp && zp != x) {
      return NodeError(node, absl::StrCat("the zero point is ", DataTypeName(zp), " but x is ",
                                          DataTypeName(x), "; they must be the same type"));
    }
    want = scale;
  }
  if (out != DataType::kUnknown && out != want) {
    return NodeError(node, absl::StrCat("the output is declared ", DataTypeName(out), " but ",
                                        node.op_type, " gives ", DataTypeName(want)));
  }
  return want;
}

// The first element of a zero-point tensor that is not 0, or -1.
int64_t FirstNonZero(const TypedTensor& t) {
  for (int64_t i = 0; i < t.size(); ++i) {
    if (t.GetInt64(i) != 0) return i;
  }
  return -1;
}

absl::Status QdqValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 2, 3); !s.ok()) return s;
  if (!HasInput(node, 1)) return NodeError(node, "the scale (input 1) is required");
  if (const int64_t block = node.GetInt("block_size", 0); block != 0) {
    return NodeUnsupported(node, absl::StrCat("blocked quantization (block_size ", block,
                                              ") is not supported; per-tensor and per-axis are"));
  }
  const bool has_zp = HasInput(node, 2);
  const DataType out = graph.value(node.outputs[0]).type;
  auto type =
      QdqTypes(node, GraphTypeOf(graph, node.inputs[0]), GraphTypeOf(graph, node.inputs[1]),
               has_zp ? GraphTypeOf(graph, node.inputs[2]) : DataType::kUnknown, has_zp, out);
  if (!type.ok()) return type.status();
  // DequantizeLinear of INT32 (a bias): the zero point must be 0.
  if (node.op_type == "DequantizeLinear" && has_zp &&
      GraphTypeOf(graph, node.inputs[0]) == DataType::kInt32) {
    const Constant* zp = graph.FindConstant(node.inputs[2]);
    if (zp == nullptr) return NodeError(node, "an INT32 x needs a constant zero point of 0");
    for (size_t i = 0; i < zp->i64.size(); ++i) {
      if (zp->i64[i] != 0) {
        return NodeError(node, absl::StrCat("an INT32 x needs a zero point of 0; element ", i,
                                            " is ", zp->i64[i]));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> QuantizeAxisOf(const Node& node, const Shape& x, const Shape& scale) {
  if (const int64_t block = node.GetInt("block_size", 0); block != 0) {
    return NodeUnsupported(node, absl::StrCat("blocked quantization (block_size ", block,
                                              ") is not supported; per-tensor and per-axis are"));
  }
  if (scale.empty() || (scale.size() == 1 && scale[0] == 1)) return -1;
  if (scale.size() != 1) {
    return NodeError(node, absl::StrCat("the scale is ", kernels::ShapeToString(scale),
                                        "; it must be a scalar (per tensor) or 1-D (per axis)"));
  }
  const int64_t rank = static_cast<int64_t>(x.size());
  const int64_t axis = node.GetInt("axis", 1);
  auto a = kernels::NormalizeAxis(axis, rank);
  if (!a.ok()) {
    return NodeError(node, absl::StrCat("axis ", axis, " is out of range for x of rank ", rank));
  }
  if (scale[0] != x[*a]) {
    return NodeError(
        node, absl::StrCat("the scale has ", scale[0], " values but x ", kernels::ShapeToString(x),
                           " has ", x[*a], " along axis ", *a));
  }
  return *a;
}

namespace {

// Checks the scale and zero-point shapes against x; the axis (-1: per tensor).
absl::StatusOr<int64_t> QdqAxis(const Node& node, const Shape& x, const Shape& scale,
                                const Shape* zp) {
  auto axis = QuantizeAxisOf(node, x, scale);
  if (!axis.ok()) return axis.status();
  if (zp != nullptr && *zp != scale &&
      !(kernels::NumElements(*zp) == 1 && kernels::NumElements(scale) == 1 && zp->size() <= 1)) {
    return NodeError(
        node, absl::StrCat("the zero point is ", kernels::ShapeToString(*zp), " but the scale is ",
                           kernels::ShapeToString(scale), "; they must have the same shape"));
  }
  return axis;
}

ShapesOr QdqShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  if (in.size() < 2 || in[0] == nullptr || in[1] == nullptr) {
    return NodeError(node, "x and the scale (inputs 0 and 1) are required");
  }
  auto axis = QdqAxis(node, *in[0], *in[1], in.size() > 2 ? in[2] : nullptr);
  if (!axis.ok()) return axis.status();
  return std::vector<Shape>{*in[0]};
}

// Per element of x: which scale it uses (the index along the axis).
struct ChannelOf {
  int64_t inner = 1;  // elements after the axis
  int64_t dim = 1;    // the axis's extent (1: per tensor)
  int64_t operator()(int64_t i) const { return dim == 1 ? 0 : (i / inner) % dim; }
};

ChannelOf ChannelsFor(const Shape& x, int64_t axis) {
  ChannelOf c;
  if (axis < 0) return c;
  c.dim = x[axis];
  for (size_t d = axis + 1; d < x.size(); ++d) c.inner *= x[d];
  return c;
}

// The typed inputs' types, shapes and zero points, checked; the axis.
struct QdqArgs {
  DataType out_type = DataType::kUnknown;
  ChannelOf channel;
  std::vector<float> scales;
  std::vector<int64_t> zero_points;  // as many as scales (zeros when omitted)
};

absl::StatusOr<QdqArgs> QdqArgsOf(const Node& node, const TypedIn& in) {
  if (in.size() < 2 || in[0] == nullptr || in[1] == nullptr) {
    return NodeError(node, "x and the scale (inputs 0 and 1) are required");
  }
  const TypedTensor* zp = in.size() > 2 ? in[2] : nullptr;
  QdqArgs args;
  auto type =
      QdqTypes(node, in[0]->type, in[1]->type, zp != nullptr ? zp->type : DataType::kUnknown,
               zp != nullptr, DataType::kUnknown);
  if (!type.ok()) return type.status();
  args.out_type = *type;
  auto axis = QdqAxis(node, in[0]->shape, in[1]->shape, zp != nullptr ? &zp->shape : nullptr);
  if (!axis.ok()) return axis.status();
  args.channel = ChannelsFor(in[0]->shape, *axis);
  const TypedTensor scale = in[1]->CastTo(DataType::kFloat32);
  args.scales.assign(scale.data<float>(), scale.data<float>() + scale.size());
  args.zero_points.assign(args.scales.size(), 0);
  if (zp != nullptr) {
    for (int64_t i = 0; i < zp->size(); ++i) args.zero_points[i] = zp->GetInt64(i);
    if (in[0]->type == DataType::kInt32 && node.op_type == "DequantizeLinear") {
      if (const int64_t i = FirstNonZero(*zp); i >= 0) {
        return NodeError(node, absl::StrCat("an INT32 x needs a zero point of 0; element ", i,
                                            " is ", zp->GetInt64(i)));
      }
    }
  }
  return args;
}

// round_half_to_even(v) + zp, saturated to [lo, hi]; NaN gives 0.
template <typename Q>
Q QuantizeElement(float v, int64_t zp) {
  if (std::isnan(v)) return Q(0);
  const double r = static_cast<double>(std::nearbyint(v)) + static_cast<double>(zp);
  const double lo = static_cast<double>(std::numeric_limits<Q>::lowest());
  const double hi = static_cast<double>(std::numeric_limits<Q>::max());
  return static_cast<Q>(std::clamp(r, lo, hi));
}

TypedOr QuantizeTyped(const Graph&, const Node& node, const TypedIn& in) {
  auto args = QdqArgsOf(node, in);
  if (!args.ok()) return args.status();
  TypedTensor converted;
  const TypedTensor* x = in[0];
  if (x->type != DataType::kFloat32) {
    converted = x->CastTo(DataType::kFloat32);
    x = &converted;
  }
  const float* px = x->data<float>();
  TypedTensor y(args->out_type, x->shape);
  VisitType(
      args->out_type,
      [&](auto tag) {
        using Q = typename decltype(tag)::type;
        if constexpr (std::is_integral_v<Q> && !std::is_same_v<Q, bool>) {
          Q* py = y.data<Q>();
          for (int64_t i = 0; i < x->size(); ++i) {
            const int64_t c = args->channel(i);
            py[i] = QuantizeElement<Q>(px[i] / args->scales[c], args->zero_points[c]);
          }
        }
      },
      [] {});
  return OneT(std::move(y));
}

TypedOr DequantizeTyped(const Graph&, const Node& node, const TypedIn& in) {
  auto args = QdqArgsOf(node, in);
  if (!args.ok()) return args.status();
  const TypedTensor& x = *in[0];
  TypedTensor y(DataType::kFloat32, x.shape);
  float* py = y.data<float>();
  VisitType(
      x.type,
      [&](auto tag) {
        using Q = typename decltype(tag)::type;
        if constexpr (std::is_integral_v<Q> && !std::is_same_v<Q, bool>) {
          const Q* px = x.data<Q>();
          for (int64_t i = 0; i < x.size(); ++i) {
            const int64_t c = args->channel(i);
            const int64_t d = static_cast<int64_t>(px[i]) - args->zero_points[c];
            py[i] = static_cast<float>(d) * args->scales[c];
          }
        }
      },
      [] {});
  if (args->out_type != DataType::kFloat32) return OneT(y.CastTo(args->out_type));
  return OneT(std::move(y));
}

absl::Status QdqAccepts(const Node& node, const Types& in, const Types& out) {
  const bool has_zp = HasInput(node, 2);
  return QdqTypes(node, in[0], in[1], has_zp ? in[2] : DataType::kUnknown, has_zp, out[0]).status();
}

// The FP32 path (every runtime value FP32, e.g. a DequantizeLinear of a
// constant with a runtime scale): the inputs back in their graph types,
// through the typed reference.
TensorsOr QdqReference(const Graph& graph, const Node& node, const std::vector<const Tensor*>& in) {
  std::vector<TypedTensor> held(in.size());
  TypedIn args(in.size(), nullptr);
  for (size_t i = 0; i < in.size(); ++i) {
    if (!HasInput(node, i)) continue;
    const ValueId v = node.inputs[i];
    const Constant* c = graph.FindConstant(v);
    if (c != nullptr && c->type != DataType::kFloat32 && c->type != DataType::kUnknown &&
        c->bytes.size() == kernels::NumElements(c->shape) * DataTypeSize(c->type)) {
      held[i] = TypedTensor::View(c->type, c->shape, c->bytes.data());
    } else if (in[i] != nullptr) {
      held[i] = TypedTensor::FromFloat(*in[i]);
      const DataType type = GraphTypeOf(graph, v);
      if (type != DataType::kFloat32 && type != DataType::kUnknown) {
        held[i] = held[i].CastTo(type);
      }
    } else {
      return NodeError(node, absl::StrCat("input ", i, " has no readable data"));
    }
    args[i] = &held[i];
  }
  auto out = node.op_type == "QuantizeLinear" ? QuantizeTyped(graph, node, args)
                                              : DequantizeTyped(graph, node, args);
  if (!out.ok()) return out.status();
  return One((*out)[0].ToFloat());
}

struct TypedRow {
  absl::string_view op;
  absl::StatusOr<std::vector<TypedTensor>> (*run)(const Graph&, const Node&, const TypedIn&);
  absl::Status (*accepts)(const Node&, const Types&, const Types&);
};

const TypedRow kTypedRows[] = {
    {"Transpose", MoveReference, MoveAccepts},
    {"Concat", MoveReference, MoveAccepts},
    {"Split", MoveReference, MoveAccepts},
    {"Slice", MoveReference, MoveAccepts},
    {"Expand", MoveReference, MoveAccepts},
    {"Tile", MoveReference, MoveAccepts},
    {"DepthToSpace", MoveReference, MoveAccepts},
    {"SpaceToDepth", MoveReference, MoveAccepts},
    {"Pad", PadTyped, MoveAccepts},
    {"Gather", GatherTyped, GatherAccepts},
    {"Reshape", ViewTyped, MoveAccepts},
    {"Flatten", ViewTyped, MoveAccepts},
    {"Squeeze", ViewTyped, MoveAccepts},
    {"Unsqueeze", ViewTyped, MoveAccepts},
    {"Identity", ViewTyped, MoveAccepts},
    {"Dropout", ViewTyped, DropoutAccepts},
    {"Cast", CastTyped, CastAccepts},
    {"CastLike", CastLikeTyped, CastLikeAccepts},
    {"Shape", ShapeTyped, Int64Output},
    {"Size", SizeTyped, Int64Output},
    {"ConstantOfShape", ConstantOfShapeTyped, ConstantOfShapeAccepts},
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
    {"MaxPool", MaxPoolTyped, MaxPoolAccepts},
    {"ReduceSum", ReduceTyped, ReduceAccepts},
    {"ReduceMax", ReduceTyped, ReduceAccepts},
    {"ReduceMin", ReduceTyped, ReduceAccepts},
    {"QuantizeLinear", QuantizeTyped, QdqAccepts},
    {"DequantizeLinear", DequantizeTyped, QdqAccepts},
};

}  // namespace

void AddTypedOps(std::vector<OpSchema>& table) {
  table.push_back({"CastLike", CastLikeValidate, SameShape, CastLikeReference, NoFlops});
  table.push_back({"QuantizeLinear", QdqValidate, QdqShapes, QdqReference, NoFlops});
  table.push_back({"DequantizeLinear", QdqValidate, QdqShapes, QdqReference, NoFlops});
  for (OpSchema& schema : table) {
    for (const TypedRow& row : kTypedRows) {
      if (row.op == schema.op_type) {
        schema.typed_reference = row.run;
        schema.typed_accepts = row.accepts;
      }
    }
  }
}

}  // namespace numaserve::engine::ops
