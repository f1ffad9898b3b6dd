// Typed references: the ops that run on values of any supported element
// type (engine/ir/typed_tensor.h), for nodes that read or write a runtime
// value other than FP32: data movement, Gather, Cast and CastLike, Shape,
// Size, ConstantOfShape, MaxPool, the reductions; the element-wise ones are
// in typed_elementwise_ops.cc, QuantizeLinear and DequantizeLinear in
// quantize_ops.cc, and AddTypedOps attaches all of them. Numeric ops compute in
// the element's own type (INT64 exactly), FP16/BF16 in float rounded back,
// FP64 in double. Data-movement ops run the FP32 reference on the positions
// of the elements and move the typed elements to where their positions
// landed (exact at any size: from 2^24 elements the positions go through
// two passes of 12-bit halves).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "engine/ir/typed_tensor.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"
#include "engine/ops/typed_util.h"
#include "kernels/ref/elementwise_ref.h"
#include "kernels/shape_ops.h"

namespace numaserve::engine::ops {

absl::Status Refuse(const Node& node, DataType type, absl::string_view what) {
  return NodeUnsupported(
      node, absl::StrCat(what, " of type ", DataTypeName(type), " has no typed implementation"));
}

absl::Status AllKnown(const Node& node, const Types& in, const Types& out) {
  for (size_t i = 0; i < in.size(); ++i) {
    if (HasInput(node, i) && !Known(in[i])) return Refuse(node, in[i], "an input");
  }
  for (DataType t : out) {
    if (!Known(t)) return Refuse(node, t, "an output");
  }
  return absl::OkStatus();
}

namespace {

// Written only while the registry's table is built (once, under the
// static initialisation of AllOpSchemas), read after it.
std::vector<std::string>& RowsWithoutOp() {
  static auto* rows = new std::vector<std::string>();
  return *rows;
}

}  // namespace

void SetTypedRows(std::vector<OpSchema>& table, absl::Span<const TypedRow> rows) {
  for (const TypedRow& row : rows) {
    bool matched = false;
    for (OpSchema& schema : table) {
      if (row.op != schema.op_type) continue;
      schema.typed_reference = row.run;
      schema.typed_accepts = row.accepts;
      matched = true;
    }
    if (!matched) RowsWithoutOp().emplace_back(row.op);
  }
}

std::vector<std::string> TypedRowsWithoutOp() {
  AllOpSchemas();  // the table built, every row set
  return RowsWithoutOp();
}

namespace {

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
  const auto& given = *axes;  // no axes, or the axes given
  if (given.has_value() && !given->empty()) {
    auto norm = NormalizeAxes(node, *given, rank);
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
    {"MaxPool", MaxPoolTyped, MaxPoolAccepts},
    {"ReduceSum", ReduceTyped, ReduceAccepts},
    {"ReduceMax", ReduceTyped, ReduceAccepts},
    {"ReduceMin", ReduceTyped, ReduceAccepts},
};

}  // namespace

void AddTypedOps(std::vector<OpSchema>& table) {
  table.push_back({"CastLike", CastLikeValidate, SameShape, CastLikeReference, NoFlops});
  SetTypedRows(table, kTypedRows);
  SetTypedRows(table, TypedElementwiseRows());
}

}  // namespace numaserve::engine::ops
