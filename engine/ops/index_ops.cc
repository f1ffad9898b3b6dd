// Op table rows for ops that compute along one axis or over index
// positions: ArgMax, ArgMin, CumSum, Trilu, TopK, OneHot, Range, NonZero.
// Each has
// one typed reference (any numeric element type, INT64 exactly); the FP32
// reference runs the same code on FP32 tensors (FloatThroughTyped). Integer
// operands that set a shape or an axis (CumSum's axis, Trilu's k, TopK's K,
// OneHot's depth, Range's inputs) must be constants, and so must NonZero's
// input (its output's shape depends on its values).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"
#include "engine/ops/typed_exec.h"
#include "engine/ops/typed_util.h"
#include "kernels/shape_ops.h"

namespace numaserve::engine::ops {

TensorsOr FloatThroughTyped(const Graph& graph, const Node& node,
                            const std::vector<const Tensor*>& in,
                            TypedOr (*run)(const Graph&, const Node&, const TypedIn&)) {
  std::vector<TypedTensor> held(in.size());
  TypedIn args(in.size(), nullptr);
  for (size_t i = 0; i < in.size(); ++i) {
    if (!HasInput(node, i)) continue;
    // Constants exactly as the model holds them (INT64 indices above 2^24).
    if (const Constant* c = graph.FindConstant(node.inputs[i]); c != nullptr) {
      if (auto t = ConstantAsTyped(*c); t.ok()) {
        held[i] = *std::move(t);
        args[i] = &held[i];
        continue;
      }
    }
    if (in[i] == nullptr) return NodeError(node, absl::StrCat("input ", i, " has no value"));
    held[i] = TypedTensor::View(DataType::kFloat32, in[i]->shape, in[i]->data.data());
    args[i] = &held[i];
  }
  auto out = run(graph, node, args);
  if (!out.ok()) return out.status();
  std::vector<Tensor> result;
  for (const TypedTensor& t : *out) result.push_back(t.ToFloat());
  return result;
}

absl::StatusOr<int64_t> CheckedIndex(const Graph& graph, const Node& node, size_t input,
                                     int64_t element, int64_t index, int64_t dim) {
  const int64_t k = index < 0 ? index + dim : index;
  if (k < 0 || k >= dim) {
    return NodeError(
        node, absl::StrCat("index ", index, " is out of range for dim ", dim, " (element ", element,
                           " of '", graph.value(node.inputs[input]).name, "')"));
  }
  return k;
}

absl::Status CheckFlag(const Node& node, const std::string& name, int64_t default_value) {
  const int64_t v = node.GetInt(name, default_value);
  if (v != 0 && v != 1) return NodeError(node, absl::StrCat(name, " must be 0 or 1, is ", v));
  return absl::OkStatus();
}

namespace {

// The extents before, along and after `axis` (normalised) of `shape`.
struct AxisSplit {
  int64_t outer = 1, dim = 1, inner = 1;
};

AxisSplit SplitAt(const Shape& shape, int64_t axis) {
  AxisSplit s;
  for (int64_t d = 0; d < axis; ++d) s.outer *= shape[d];
  s.dim = shape[axis];
  for (size_t d = axis + 1; d < shape.size(); ++d) s.inner *= shape[d];
  return s;
}

absl::StatusOr<int64_t> AxisOf(const Node& node, int64_t axis, size_t rank) {
  auto a = kernels::NormalizeAxis(axis, static_cast<int64_t>(rank));
  if (!a.ok()) return NodeError(node, a.status().message());
  return *a;
}

// The one value of a constant integer input `index` (a scalar or a
// one-element tensor); `fallback` when the input is omitted.
absl::StatusOr<int64_t> ConstScalar(const Graph& graph, const Node& node, size_t index,
                                    absl::string_view what, std::optional<int64_t> fallback) {
  auto v = ConstInts(graph, node, index, what);
  if (!v.ok()) return v.status();
  const auto& given = *v;
  if (!given.has_value()) {
    if (fallback.has_value()) return *fallback;
    return NodeError(node, absl::StrCat(what, " (input ", index, ") is required"));
  }
  if (given->size() != 1) {
    return NodeError(node, absl::StrCat(what, " must hold one value, holds ", given->size()));
  }
  return (*given)[0];
}

absl::Status IntegerType(const Node& node, DataType t, absl::string_view what) {
  if (t != DataType::kInt64 && t != DataType::kInt32) return Refuse(node, t, what);
  return absl::OkStatus();
}

// --- ArgMax, ArgMin ------------------------------------------------------------

absl::Status ArgValidate(const Graph&, const Node& node) {
  if (absl::Status s = CheckArity(node, 1, 1); !s.ok()) return s;
  if (absl::Status s = CheckFlag(node, "keepdims", 1); !s.ok()) return s;
  return CheckFlag(node, "select_last_index", 0);
}

ShapesOr ArgShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  auto axis = AxisOf(node, node.GetInt("axis", 0), in[0]->size());
  if (!axis.ok()) return axis.status();
  if ((*in[0])[*axis] == 0) {
    return NodeError(node, absl::StrCat("axis ", *axis, " of ", kernels::ShapeToString(*in[0]),
                                        " is empty: there is no element to pick"));
  }
  Shape out = *in[0];
  if (node.GetInt("keepdims", 1) != 0) {
    out[*axis] = 1;
  } else {
    out.erase(out.begin() + *axis);
  }
  return std::vector<Shape>{out};
}

template <typename T>
void ArgOf(bool max, bool last, const TypedTensor& x, const AxisSplit& s, int64_t* out) {
  const T* p = x.data<T>();
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t i = 0; i < s.inner; ++i) {
      const T* row = p + o * s.dim * s.inner + i;
      auto best = ToCompute(row[0]);
      int64_t at = 0;
      for (int64_t k = 1; k < s.dim; ++k) {
        const auto v = ToCompute(row[k * s.inner]);
        if ((max ? v > best : v < best) || (last && v == best)) {
          best = v;
          at = k;
        }
      }
      out[o * s.inner + i] = at;
    }
  }
}

TypedOr ArgTyped(const Graph& graph, const Node& node, const TypedIn& in) {
  const TypedTensor& x = *in[0];
  auto shapes = ArgShapes(graph, node, {&x.shape});
  if (!shapes.ok()) return shapes.status();
  const int64_t axis = *AxisOf(node, node.GetInt("axis", 0), x.shape.size());
  TypedTensor y(DataType::kInt64, (*shapes)[0]);
  if (y.size() == 0) return OneT(std::move(y));
  const bool max = node.op_type == "ArgMax";
  const bool last = node.GetInt("select_last_index", 0) != 0;
  VisitType(
      x.type,
      [&](auto tag) {
        ArgOf<typename decltype(tag)::type>(max, last, x, SplitAt(x.shape, axis),
                                            y.data<int64_t>());
      },
      [] {});
  return OneT(std::move(y));
}

TensorsOr ArgReference(const Graph& graph, const Node& node, const std::vector<const Tensor*>& in) {
  return FloatThroughTyped(graph, node, in, ArgTyped);
}

absl::Status ArgAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  if (!Numeric(in[0])) return Refuse(node, in[0], "the input");
  if (out[0] != DataType::kInt64) return Refuse(node, out[0], "the output (INT64 indices)");
  return absl::OkStatus();
}

// --- CumSum --------------------------------------------------------------------

absl::Status CumSumValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 2, 2); !s.ok()) return s;
  if (absl::Status s = CheckFlag(node, "exclusive", 0); !s.ok()) return s;
  if (absl::Status s = CheckFlag(node, "reverse", 0); !s.ok()) return s;
  return ConstScalar(graph, node, 1, "axis", std::nullopt).status();
}

ShapesOr CumSumShapes(const Graph& graph, const Node& node, const std::vector<const Shape*>& in) {
  auto axis = ConstScalar(graph, node, 1, "axis", std::nullopt);
  if (!axis.ok()) return axis.status();
  if (auto a = AxisOf(node, *axis, in[0]->size()); !a.ok()) return a.status();
  return std::vector<Shape>{*in[0]};
}

template <typename T>
void CumSumOf(const TypedTensor& x, const AxisSplit& s, bool exclusive, bool reverse,
              TypedTensor& y) {
  using C = Compute<T>;
  const T* px = x.data<T>();
  T* py = y.data<T>();
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t i = 0; i < s.inner; ++i) {
      C acc{};
      for (int64_t step = 0; step < s.dim; ++step) {
        const int64_t k = reverse ? s.dim - 1 - step : step;
        const int64_t at = (o * s.dim + k) * s.inner + i;
        const C before = acc;
        if constexpr (std::is_integral_v<C>) {  // wraps as two's complement
          using U = std::make_unsigned_t<C>;
          acc = static_cast<C>(static_cast<U>(acc) + static_cast<U>(ToCompute(px[at])));
        } else {
          acc = acc + ToCompute(px[at]);
        }
        py[at] = FromCompute<T>(exclusive ? before : acc);
      }
    }
  }
}

TypedOr CumSumTyped(const Graph& graph, const Node& node, const TypedIn& in) {
  const TypedTensor& x = *in[0];
  auto axis = ConstScalar(graph, node, 1, "axis", std::nullopt);
  if (!axis.ok()) return axis.status();
  auto a = AxisOf(node, *axis, x.shape.size());
  if (!a.ok()) return a.status();
  TypedTensor y(x.type, x.shape);
  if (y.size() == 0) return OneT(std::move(y));
  const bool exclusive = node.GetInt("exclusive", 0) != 0;
  const bool reverse = node.GetInt("reverse", 0) != 0;
  VisitType(
      x.type,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (!std::is_same_v<T, bool>) {
          CumSumOf<T>(x, SplitAt(x.shape, *a), exclusive, reverse, y);
        }
      },
      [] {});
  return OneT(std::move(y));
}

TensorsOr CumSumReference(const Graph& graph, const Node& node,
                          const std::vector<const Tensor*>& in) {
  return FloatThroughTyped(graph, node, in, CumSumTyped);
}

absl::Status CumSumAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  if (!Numeric(in[0])) return Refuse(node, in[0], "the input");
  if (absl::Status s = IntegerType(node, in[1], "axis"); !s.ok()) return s;
  if (out[0] != in[0]) return Refuse(node, out[0], "the output");
  return absl::OkStatus();
}

// --- Trilu ---------------------------------------------------------------------

absl::Status TriluValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 1, 2); !s.ok()) return s;
  if (absl::Status s = CheckFlag(node, "upper", 1); !s.ok()) return s;
  return ConstScalar(graph, node, 1, "k", 0).status();
}

ShapesOr TriluShapes(const Graph& graph, const Node& node, const std::vector<const Shape*>& in) {
  if (in[0]->size() < 2) {
    return NodeError(node, absl::StrCat("the input must have rank 2 or more, is ",
                                        kernels::ShapeToString(*in[0])));
  }
  if (auto k = ConstScalar(graph, node, 1, "k", 0); !k.ok()) return k.status();
  return std::vector<Shape>{*in[0]};
}

// Element (row i, column j) of each matrix is kept when j - i >= k (upper)
// or j - i <= k (lower), else zero; any element type.
TypedOr TriluTyped(const Graph& graph, const Node& node, const TypedIn& in) {
  const TypedTensor& x = *in[0];
  auto shapes = TriluShapes(graph, node, {&x.shape});
  if (!shapes.ok()) return shapes.status();
  const int64_t k = *ConstScalar(graph, node, 1, "k", 0);
  const bool upper = node.GetInt("upper", 1) != 0;
  TypedTensor y(x.type, x.shape);  // zero-filled
  if (y.size() == 0) return OneT(std::move(y));
  const int64_t rows = x.shape[x.shape.size() - 2], cols = x.shape.back();
  const int64_t matrices = x.size() / (rows * cols);
  const size_t es = x.element_size();
  for (int64_t m = 0; m < matrices; ++m) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        // j - i is within +-2^31: no overflow against any k.
        const bool keep = upper ? j - i >= k : j - i <= k;
        if (!keep) continue;
        const int64_t at = (m * rows + i) * cols + j;
        std::memcpy(y.bytes.data() + at * es, x.raw() + at * es, es);
      }
    }
  }
  return OneT(std::move(y));
}

TensorsOr TriluReference(const Graph& graph, const Node& node,
                         const std::vector<const Tensor*>& in) {
  return FloatThroughTyped(graph, node, in, TriluTyped);
}

absl::Status TriluAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  if (in.size() > 1 && HasInput(node, 1)) {
    if (absl::Status s = IntegerType(node, in[1], "k"); !s.ok()) return s;
  }
  if (out[0] != in[0]) return Refuse(node, out[0], "the output");
  return absl::OkStatus();
}

// --- TopK ----------------------------------------------------------------------

absl::Status TopKValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 2, 2, 1, 2); !s.ok()) return s;
  if (absl::Status s = CheckFlag(node, "largest", 1); !s.ok()) return s;
  if (absl::Status s = CheckFlag(node, "sorted", 1); !s.ok()) return s;
  auto k = ConstScalar(graph, node, 1, "K", std::nullopt);
  if (!k.ok()) return k.status();
  if (*k < 0) return NodeError(node, absl::StrCat("K must not be negative, is ", *k));
  return absl::OkStatus();
}

ShapesOr TopKShapes(const Graph& graph, const Node& node, const std::vector<const Shape*>& in) {
  auto axis = AxisOf(node, node.GetInt("axis", -1), in[0]->size());
  if (!axis.ok()) return axis.status();
  auto k = ConstScalar(graph, node, 1, "K", std::nullopt);
  if (!k.ok()) return k.status();
  if (*k < 0 || *k > (*in[0])[*axis]) {
    return NodeError(node, absl::StrCat("K ", *k, " is not in 0..", (*in[0])[*axis], " (axis ",
                                        *axis, " of ", kernels::ShapeToString(*in[0]), ")"));
  }
  Shape out = *in[0];
  out[*axis] = *k;
  return std::vector<Shape>(node.outputs.size(), out);
}

// The K largest (or smallest) along the axis, sorted; equal values in
// index order (as ONNX Runtime orders them).
template <typename T>
void TopKOf(const TypedTensor& x, const AxisSplit& s, int64_t k, bool largest, TypedTensor& values,
            TypedTensor& indices) {
  using C = Compute<T>;
  const T* px = x.data<T>();
  std::vector<std::pair<C, int64_t>> row(s.dim);
  // NaN above every number (a strict weak order, whatever the values).
  auto greater = [](C a, C b) {
    if constexpr (std::is_floating_point_v<C>) {
      if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && !std::isnan(b);
    }
    return a > b;
  };
  auto before = [&](const std::pair<C, int64_t>& a, const std::pair<C, int64_t>& b) {
    if (greater(a.first, b.first)) return largest;
    if (greater(b.first, a.first)) return !largest;
    return a.second < b.second;
  };
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t i = 0; i < s.inner; ++i) {
      for (int64_t j = 0; j < s.dim; ++j)
        row[j] = {ToCompute(px[(o * s.dim + j) * s.inner + i]), j};
      std::partial_sort(row.begin(), row.begin() + k, row.end(), before);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t at = (o * k + j) * s.inner + i;
        values.data<T>()[at] = FromCompute<T>(row[j].first);
        indices.data<int64_t>()[at] = row[j].second;
      }
    }
  }
}

TypedOr TopKTyped(const Graph& graph, const Node& node, const TypedIn& in) {
  const TypedTensor& x = *in[0];
  auto shapes = TopKShapes(graph, node, {&x.shape, nullptr});
  if (!shapes.ok()) return shapes.status();
  const int64_t axis = *AxisOf(node, node.GetInt("axis", -1), x.shape.size());
  const Shape& out_shape = (*shapes)[0];
  std::vector<TypedTensor> out;
  out.emplace_back(x.type, out_shape);
  out.emplace_back(DataType::kInt64, out_shape);
  if (out[0].size() == 0) return out;
  const bool largest = node.GetInt("largest", 1) != 0;
  VisitType(
      x.type,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (!std::is_same_v<T, bool>) {
          TopKOf<T>(x, SplitAt(x.shape, axis), out_shape[axis], largest, out[0], out[1]);
        }
      },
      [] {});
  if (node.outputs.size() < 2) out.pop_back();
  return out;
}

TensorsOr TopKReference(const Graph& graph, const Node& node,
                        const std::vector<const Tensor*>& in) {
  return FloatThroughTyped(graph, node, in, TopKTyped);
}

absl::Status TopKAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  if (!Numeric(in[0])) return Refuse(node, in[0], "the input");
  if (out[0] != in[0]) return Refuse(node, out[0], "Values");
  if (out.size() > 1 && out[1] != DataType::kInt64) return Refuse(node, out[1], "Indices");
  return absl::OkStatus();
}

// --- OneHot --------------------------------------------------------------------

absl::StatusOr<int64_t> OneHotDepth(const Graph& graph, const Node& node) {
  auto depth = ConstScalar(graph, node, 1, "depth", std::nullopt);
  if (!depth.ok()) return depth.status();
  if (*depth < 1 || *depth > kernels::kMaxTensorElements) {
    return NodeError(
        node, absl::StrCat("depth must be in 1..", kernels::kMaxTensorElements, ", is ", *depth));
  }
  return *depth;
}

absl::Status OneHotValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 3, 3); !s.ok()) return s;
  if (!HasInput(node, 1) || !HasInput(node, 2)) {
    return NodeError(node, "depth and values are required");
  }
  return OneHotDepth(graph, node).status();
}

ShapesOr OneHotShapes(const Graph& graph, const Node& node, const std::vector<const Shape*>& in) {
  auto depth = OneHotDepth(graph, node);
  if (!depth.ok()) return depth.status();
  if (in.size() > 2 && in[2] != nullptr && kernels::NumElements(*in[2]) != 2) {
    return NodeError(node, absl::StrCat("values must hold two elements (off, on), is ",
                                        kernels::ShapeToString(*in[2])));
  }
  auto axis = AxisOf(node, node.GetInt("axis", -1), in[0]->size() + 1);
  if (!axis.ok()) return axis.status();
  Shape out = *in[0];
  out.insert(out.begin() + *axis, *depth);
  if (absl::Status s = CheckShape(node, out, "the output"); !s.ok()) return s;
  return std::vector<Shape>{out};
}

// Indices in [-depth, depth) set `on` (negative ones count from the end);
// any other index leaves its row `off`, as ONNX defines.
TypedOr OneHotTyped(const Graph& graph, const Node& node, const TypedIn& in) {
  const TypedTensor& indices = *in[0];
  const TypedTensor& values = *in[2];
  auto shapes = OneHotShapes(graph, node, {&indices.shape, &in[1]->shape, &values.shape});
  if (!shapes.ok()) return shapes.status();
  const int64_t depth = *OneHotDepth(graph, node);
  const int64_t axis = *AxisOf(node, node.GetInt("axis", -1), indices.shape.size() + 1);
  TypedTensor y(values.type, (*shapes)[0]);
  const size_t es = values.element_size();
  for (int64_t e = 0; e < y.size(); ++e) std::memcpy(y.bytes.data() + e * es, values.raw(), es);
  int64_t inner = 1;  // the index dims after the axis
  for (size_t d = axis; d < indices.shape.size(); ++d) inner *= indices.shape[d];
  for (int64_t e = 0; e < indices.size(); ++e) {
    // Cast semantics: a fractional FP index truncates toward zero.
    int64_t k = indices.GetInt64(e);
    if (k < -depth || k >= depth) continue;
    if (k < 0) k += depth;
    const int64_t at = ((e / inner) * depth + k) * inner + e % inner;
    std::memcpy(y.bytes.data() + at * es, values.raw() + es, es);
  }
  return OneT(std::move(y));
}

TensorsOr OneHotReference(const Graph& graph, const Node& node,
                          const std::vector<const Tensor*>& in) {
  return FloatThroughTyped(graph, node, in, OneHotTyped);
}

absl::Status OneHotAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  if (!Numeric(in[0])) return Refuse(node, in[0], "indices");
  if (out[0] != in[2]) return Refuse(node, out[0], "the output (not the values' type)");
  return absl::OkStatus();
}

// --- Range ---------------------------------------------------------------------

// Range's output length depends on its inputs' values: they must be
// constants (where they are, the node folds at load).
absl::Status RangeValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 3, 3); !s.ok()) return s;
  for (size_t i = 0; i < 3; ++i) {
    if (!HasInput(node, i) || !graph.IsConstant(node.inputs[i])) {
      return NodeUnsupported(node,
                             "start, limit and delta must be constants (the output's length "
                             "depends on their values, and data-dependent shapes are not "
                             "supported)");
    }
    if (kernels::NumElements(graph.FindConstant(node.inputs[i])->shape) != 1) {
      return NodeError(node, "start, limit and delta must be scalars");
    }
  }
  return absl::OkStatus();
}

// max(ceil((limit - start) / delta), 0), computed in long double; an error
// for a zero, NaN or infinite delta or a length the engine cannot hold.
absl::StatusOr<int64_t> RangeLength(const Node& node, long double start, long double limit,
                                    long double delta) {
  const long double n = std::ceil((limit - start) / delta);
  if (delta == 0 || !std::isfinite(n)) {
    return NodeError(node, "delta must be non-zero and the length finite");
  }
  if (n > static_cast<long double>(kernels::kMaxTensorElements)) {
    return NodeError(node,
                     absl::StrCat("the output's length is above ", kernels::kMaxTensorElements));
  }
  return n < 0 ? int64_t{0} : static_cast<int64_t>(n);
}

TypedOr RangeTyped(const Graph& graph, const Node& node, const TypedIn& in) {
  for (size_t i = 0; i < 3; ++i) {
    if (in[i] == nullptr || in[i]->size() != 1 || in[i]->type != in[0]->type) {
      return NodeError(node, "start, limit and delta must be scalars of one type");
    }
  }
  TypedTensor y;
  absl::Status status = absl::OkStatus();
  VisitType(
      in[0]->type,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        using C = Compute<T>;
        if constexpr (!std::is_same_v<T, bool>) {
          const C start = ToCompute(in[0]->data<T>()[0]), delta = ToCompute(in[2]->data<T>()[0]);
          auto n = RangeLength(node, static_cast<long double>(start),
                               static_cast<long double>(ToCompute(in[1]->data<T>()[0])),
                               static_cast<long double>(delta));
          if (!n.ok()) {
            status = n.status();
            return;
          }
          y = TypedTensor(in[0]->type, Shape{*n});
          // start + i * delta, as ONNX defines it; integers wrap as two's
          // complement on the way (the result lies between start and limit).
          for (int64_t i = 0; i < *n; ++i) {
            if constexpr (std::is_integral_v<C>) {
              using U = std::make_unsigned_t<C>;
              y.data<T>()[i] =
                  static_cast<C>(static_cast<U>(start) + static_cast<U>(i) * static_cast<U>(delta));
            } else {
              y.data<T>()[i] = FromCompute<T>(static_cast<C>(start + static_cast<C>(i) * delta));
            }
          }
        } else {
          status = Refuse(node, in[0]->type, "start");
        }
      },
      [] {});
  if (!status.ok()) return status;
  return OneT(std::move(y));
}

TensorsOr RangeReference(const Graph& graph, const Node& node,
                         const std::vector<const Tensor*>& in) {
  return FloatThroughTyped(graph, node, in, RangeTyped);
}

ShapesOr RangeShapes(const Graph& graph, const Node& node, const std::vector<const Shape*>&) {
  if (absl::Status s = RangeValidate(graph, node); !s.ok()) return s;
  TypedIn args;
  std::vector<TypedTensor> held(3);
  for (size_t i = 0; i < 3; ++i) {
    auto t = ConstantAsTyped(*graph.FindConstant(node.inputs[i]));
    if (!t.ok()) return NodeError(node, t.status().message());
    held[i] = *std::move(t);
  }
  for (const TypedTensor& t : held) args.push_back(&t);
  auto out = RangeTyped(graph, node, args);
  if (!out.ok()) return out.status();
  return std::vector<Shape>{(*out)[0].shape};
}

absl::Status RangeAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  if (!Numeric(in[0])) return Refuse(node, in[0], "start");
  if (in[1] != in[0] || in[2] != in[0] || out[0] != in[0]) {
    return NodeError(node, "start, limit, delta and the output must have one type");
  }
  return absl::OkStatus();
}

// --- NonZero -------------------------------------------------------------------

// NonZero's output [rank, count of non-zero elements] depends on its
// input's values: the input must be a constant (where it is, the node
// folds at load).
absl::Status NonZeroValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 1, 1); !s.ok()) return s;
  if (!graph.IsConstant(node.inputs[0])) {
    return NodeUnsupported(node,
                           "its input must be a constant (the output's shape depends on the "
                           "input's values, and data-dependent shapes are not supported)");
  }
  if (graph.FindConstant(node.inputs[0])->shape.empty()) {
    return NodeUnsupported(node, "a scalar input is not supported");
  }
  return absl::OkStatus();
}

TypedOr NonZeroTyped(const Graph&, const Node& node, const TypedIn& in) {
  const TypedTensor& x = *in[0];
  if (x.shape.empty()) return NodeUnsupported(node, "a scalar input is not supported");
  std::vector<int64_t> at;  // flat indices of the non-zero elements
  for (int64_t i = 0; i < x.size(); ++i) {
    if (x.GetDouble(i) != 0) at.push_back(i);  // NaN is non-zero, as in NumPy
  }
  const auto rank = static_cast<int64_t>(x.shape.size());
  const auto count = static_cast<int64_t>(at.size());
  TypedTensor y(DataType::kInt64, Shape{rank, count});
  int64_t* out = y.data<int64_t>();
  for (int64_t k = 0; k < count; ++k) {
    int64_t rest = at[k];
    for (int64_t d = rank - 1; d >= 0; --d) {
      out[d * count + k] = rest % x.shape[d];
      rest /= x.shape[d];
    }
  }
  return OneT(std::move(y));
}

TensorsOr NonZeroReference(const Graph& graph, const Node& node,
                           const std::vector<const Tensor*>& in) {
  return FloatThroughTyped(graph, node, in, NonZeroTyped);
}

ShapesOr NonZeroShapes(const Graph& graph, const Node& node, const std::vector<const Shape*>&) {
  if (absl::Status s = NonZeroValidate(graph, node); !s.ok()) return s;
  auto x = ConstantAsTyped(*graph.FindConstant(node.inputs[0]));
  if (!x.ok()) return NodeError(node, x.status().message());
  int64_t count = 0;
  for (int64_t i = 0; i < x->size(); ++i) count += x->GetDouble(i) != 0 ? 1 : 0;
  return std::vector<Shape>{Shape{static_cast<int64_t>(x->shape.size()), count}};
}

absl::Status NonZeroAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  if (out[0] != DataType::kInt64) return Refuse(node, out[0], "the output (not INT64)");
  return absl::OkStatus();
}

const TypedRow kIndexTypedRows[] = {
    {"ArgMax", ArgTyped, ArgAccepts},       {"ArgMin", ArgTyped, ArgAccepts},
    {"CumSum", CumSumTyped, CumSumAccepts}, {"Trilu", TriluTyped, TriluAccepts},
    {"TopK", TopKTyped, TopKAccepts},       {"OneHot", OneHotTyped, OneHotAccepts},
    {"Range", RangeTyped, RangeAccepts},    {"NonZero", NonZeroTyped, NonZeroAccepts},
};

}  // namespace

void AddIndexOps(std::vector<OpSchema>& table) {
  table.push_back({"ArgMax", ArgValidate, ArgShapes, ArgReference, NoFlops});
  table.push_back({"ArgMin", ArgValidate, ArgShapes, ArgReference, NoFlops});
  table.push_back({"CumSum", CumSumValidate, CumSumShapes, CumSumReference, NoFlops});
  table.push_back({"Trilu", TriluValidate, TriluShapes, TriluReference, NoFlops});
  table.push_back({"TopK", TopKValidate, TopKShapes, TopKReference, NoFlops});
  table.push_back({"OneHot", OneHotValidate, OneHotShapes, OneHotReference, NoFlops});
  table.push_back({"Range", RangeValidate, RangeShapes, RangeReference, NoFlops});
  table.push_back({"NonZero", NonZeroValidate, NonZeroShapes, NonZeroReference, NoFlops});
  SetTypedRows(table, kIndexTypedRows);
}

}  // namespace numaserve::engine::ops
