// QuantizeLinear and DequantizeLinear: their op registry rows, with the
// typed reference that quantizes and dequantizes and the FP32 reference
// that runs through it; also QuantizeAxisOf (engine/ops/op_tables.h), the
// scale's axis that constant folding shares.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "engine/ir/typed_tensor.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"
#include "engine/ops/typed_util.h"
#include "kernels/shape_ops.h"

namespace numaserve::engine::ops {
namespace {

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

}  // namespace

void AddQuantizeOps(std::vector<OpSchema>& table) {
  OpSchema quantize = {"QuantizeLinear", QdqValidate, QdqShapes, QdqReference, NoFlops};
  quantize.typed_reference = QuantizeTyped;
  quantize.typed_accepts = QdqAccepts;
  table.push_back(quantize);
  OpSchema dequantize = {"DequantizeLinear", QdqValidate, QdqShapes, QdqReference, NoFlops};
  dequantize.typed_reference = DequantizeTyped;
  dequantize.typed_accepts = QdqAccepts;
  table.push_back(dequantize);
}

}  // namespace numaserve::engine::ops
