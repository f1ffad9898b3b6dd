// Op table rows for gathers and scatters through index tensors:
// GatherElements, ScatterElements, GatherND, ScatterND. Indices may be
// runtime values (INT64 or INT32); a negative index counts from the end of
// its dim, and one out of range is INVALID_ARGUMENT naming the node, the
// index and where it is (never a read or write out of bounds). Each op works
// out, per element, the flat position it reads or writes, then moves the
// elements: data of any element type, the reductions (add, mul, max, min)
// on numeric types. Scatter updates apply in index order, so with repeated
// indices and no reduction the last one wins (as in ONNX Runtime).
#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"
#include "engine/ops/typed_util.h"
#include "kernels/shape_ops.h"

namespace numaserve::engine::ops {
namespace {

enum class Reduction { kNone, kAdd, kMul, kMax, kMin };

absl::StatusOr<Reduction> ReductionOf(const Node& node) {
  const std::string r = node.GetString("reduction", "none");
  if (r == "none") return Reduction::kNone;
  if (r == "add") return Reduction::kAdd;
  if (r == "mul") return Reduction::kMul;
  if (r == "max") return Reduction::kMax;
  if (r == "min") return Reduction::kMin;
  return NodeError(node,
                   absl::StrCat("reduction '", r, "' is not one of none, add, mul, max, min"));
}

std::vector<int64_t> StridesOf(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

int64_t Product(const Shape& shape, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t d = begin; d < end; ++d) p *= shape[d];
  return p;
}

absl::Status IndicesType(const Node& node, DataType t) {
  if (t != DataType::kInt64 && t != DataType::kInt32) return Refuse(node, t, "indices");
  return absl::OkStatus();
}

// --- GatherElements / ScatterElements: indices of the data's rank ---------------

// Checks indices against data for the *Elements ops (same rank; every dim
// but the axis no larger than the data's); the normalised axis.
absl::StatusOr<int64_t> ElementsAxis(const Node& node, const Shape& data, const Shape& indices) {
  auto axis = kernels::NormalizeAxis(node.GetInt("axis", 0), static_cast<int64_t>(data.size()));
  if (!axis.ok()) return NodeError(node, axis.status().message());
  bool fits = indices.size() == data.size();
  for (size_t d = 0; fits && d < data.size(); ++d) {
    fits = static_cast<int64_t>(d) == *axis || indices[d] <= data[d];
  }
  if (!fits) {
    return NodeError(node,
                     absl::StrCat("indices ", kernels::ShapeToString(indices),
                                  " must have the rank of data ", kernels::ShapeToString(data),
                                  " and no dim larger than it except on axis ", *axis));
  }
  return *axis;
}

// Per element of `indices`, the flat position in data it names.
absl::StatusOr<std::vector<int64_t>> ElementsPositions(const Graph& graph, const Node& node,
                                                       const TypedTensor& data,
                                                       const TypedTensor& indices) {
  auto axis = ElementsAxis(node, data.shape, indices.shape);
  if (!axis.ok()) return axis.status();
  const std::vector<int64_t> strides = StridesOf(data.shape);
  const size_t rank = data.shape.size();
  std::vector<int64_t> coord(rank, 0);
  std::vector<int64_t> positions(indices.size());
  for (int64_t e = 0; e < indices.size(); ++e) {
    auto k = CheckedIndex(graph, node, 1, e, indices.GetInt64(e), data.shape[*axis]);
    if (!k.ok()) return k.status();
    int64_t at = 0;
    for (size_t d = 0; d < rank; ++d) {
      at += (static_cast<int64_t>(d) == *axis ? *k : coord[d]) * strides[d];
    }
    positions[e] = at;
    for (size_t d = rank; d-- > 0;) {
      if (++coord[d] < indices.shape[d]) break;
      coord[d] = 0;
    }
  }
  return positions;
}

// --- GatherND / ScatterND: index tuples in the last dim --------------------------

struct NdSpec {
  int64_t batch_dims = 0;
  int64_t k = 0;      // the tuple length (indices' last dim)
  int64_t slice = 1;  // elements per tuple: data dims after batch_dims + k
  Shape gathered;     // GatherND's output: indices.shape[:-1] + data.shape[b+k:]
};

absl::StatusOr<NdSpec> NdSpecOf(const Node& node, const Shape& data, const Shape& indices) {
  NdSpec spec;
  spec.batch_dims = node.GetInt("batch_dims", 0);
  const int64_t r = static_cast<int64_t>(data.size()), q = static_cast<int64_t>(indices.size());
  if (r < 1 || q < 1) return NodeError(node, "data and indices must have rank 1 or more");
  if (spec.batch_dims < 0 || spec.batch_dims >= std::min(r, q)) {
    return NodeError(
        node, absl::StrCat("batch_dims ", spec.batch_dims, " must be in 0..", std::min(r, q) - 1));
  }
  spec.k = indices.back();
  if (spec.k < 1 || spec.k > r - spec.batch_dims) {
    return NodeError(node, absl::StrCat("the last dim of indices ", kernels::ShapeToString(indices),
                                        " must be in 1..", r - spec.batch_dims, " for data ",
                                        kernels::ShapeToString(data)));
  }
  for (int64_t d = 0; d < spec.batch_dims; ++d) {
    if (indices[d] != data[d]) {
      return NodeError(
          node, absl::StrCat("batch dim ", d, " differs: indices ", kernels::ShapeToString(indices),
                             ", data ", kernels::ShapeToString(data)));
    }
  }
  spec.gathered.assign(indices.begin(), indices.end() - 1);
  spec.gathered.insert(spec.gathered.end(), data.begin() + spec.batch_dims + spec.k, data.end());
  spec.slice = Product(data, spec.batch_dims + spec.k, data.size());
  return spec;
}

// Per index tuple, the flat position of the first element of its slice.
absl::StatusOr<std::vector<int64_t>> NdPositions(const Graph& graph, const Node& node,
                                                 const TypedTensor& data,
                                                 const TypedTensor& indices, const NdSpec& spec) {
  const std::vector<int64_t> strides = StridesOf(data.shape);
  const int64_t tuples = Product(indices.shape, 0, indices.shape.size() - 1);
  const int64_t per_batch = Product(indices.shape, spec.batch_dims, indices.shape.size() - 1);
  const int64_t batch_stride = Product(data.shape, spec.batch_dims, data.shape.size());
  std::vector<int64_t> positions(tuples);
  for (int64_t t = 0; t < tuples; ++t) {
    int64_t at = per_batch > 0 ? (t / per_batch) * batch_stride : 0;
    for (int64_t j = 0; j < spec.k; ++j) {
      const int64_t e = t * spec.k + j;
      const int64_t d = spec.batch_dims + j;
      auto i = CheckedIndex(graph, node, 1, e, indices.GetInt64(e), data.shape[d]);
      if (!i.ok()) return i.status();
      at += *i * strides[d];
    }
    positions[t] = at;
  }
  return positions;
}

// --- Moving the elements ---------------------------------------------------------

// y[e] = data[positions[e / slice] + e % slice], any element type.
TypedTensor GatherAt(const TypedTensor& data, const Shape& out_shape,
                     const std::vector<int64_t>& positions, int64_t slice) {
  TypedTensor y(data.type, out_shape);
  const size_t es = data.element_size();
  for (size_t p = 0; p < positions.size() && slice > 0; ++p) {
    std::memcpy(y.bytes.data() + p * slice * es, data.raw() + positions[p] * es, slice * es);
  }
  return y;
}

template <typename T>
void ReduceInto(Reduction r, T* y, const T* updates, const std::vector<int64_t>& positions,
                int64_t slice) {
  using C = Compute<T>;
  for (size_t p = 0; p < positions.size(); ++p) {
    for (int64_t s = 0; s < slice; ++s) {
      T& dst = y[positions[p] + s];
      const C a = ToCompute(dst), b = ToCompute(updates[p * slice + s]);
      C v = b;
      if (r == Reduction::kAdd || r == Reduction::kMul) {
        if constexpr (std::is_integral_v<C>) {  // wraps as two's complement
          using U = std::make_unsigned_t<C>;
          v = static_cast<C>(r == Reduction::kAdd ? static_cast<U>(a) + static_cast<U>(b)
                                                  : static_cast<U>(a) * static_cast<U>(b));
        } else {
          v = r == Reduction::kAdd ? a + b : a * b;
        }
      } else if (r == Reduction::kMax) {
        v = std::max(a, b);
      } else if (r == Reduction::kMin) {
        v = std::min(a, b);
      }
      dst = FromCompute<T>(v);
    }
  }
}

// A copy of data with updates[p * slice + s] put (or reduced) at
// positions[p] + s, in order.
TypedTensor ScatterAt(const Node& node, const TypedTensor& data, const TypedTensor& updates,
                      const std::vector<int64_t>& positions, int64_t slice) {
  TypedTensor y = data.Owned();
  const Reduction r = *ReductionOf(node);
  if (r == Reduction::kNone) {
    const size_t es = data.element_size();
    for (size_t p = 0; p < positions.size() && slice > 0; ++p) {
      std::memcpy(y.bytes.data() + positions[p] * es, updates.raw() + p * slice * es, slice * es);
    }
    return y;
  }
  VisitType(
      data.type,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (!std::is_same_v<T, bool>) {
          ReduceInto<T>(r, y.data<T>(), updates.data<T>(), positions, slice);
        }
      },
      [] {});
  return y;
}

// --- Rows -----------------------------------------------------------------------------

absl::Status GatherValidate(const Graph&, const Node& node) {
  if (absl::Status s = CheckArity(node, 2, 2); !s.ok()) return s;
  if (!HasInput(node, 1)) return NodeError(node, "indices are required");
  return absl::OkStatus();
}

absl::Status ScatterValidate(const Graph&, const Node& node) {
  if (absl::Status s = CheckArity(node, 3, 3); !s.ok()) return s;
  if (!HasInput(node, 1) || !HasInput(node, 2)) {
    return NodeError(node, "indices and updates are required");
  }
  return ReductionOf(node).status();
}

ShapesOr GatherElementsShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  if (auto axis = ElementsAxis(node, *in[0], *in[1]); !axis.ok()) return axis.status();
  return std::vector<Shape>{*in[1]};
}

ShapesOr ScatterElementsShapes(const Graph&, const Node& node,
                               const std::vector<const Shape*>& in) {
  if (auto axis = ElementsAxis(node, *in[0], *in[1]); !axis.ok()) return axis.status();
  if (*in[2] != *in[1]) {
    return NodeError(
        node, absl::StrCat("updates ", kernels::ShapeToString(*in[2]),
                           " must have the shape of indices ", kernels::ShapeToString(*in[1])));
  }
  return std::vector<Shape>{*in[0]};
}

ShapesOr GatherNDShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  auto spec = NdSpecOf(node, *in[0], *in[1]);
  if (!spec.ok()) return spec.status();
  if (absl::Status s = CheckShape(node, spec->gathered, "the output"); !s.ok()) return s;
  return std::vector<Shape>{spec->gathered};
}

ShapesOr ScatterNDShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  if (node.HasAttribute("batch_dims")) return NodeError(node, "ScatterND has no batch_dims");
  auto spec = NdSpecOf(node, *in[0], *in[1]);
  if (!spec.ok()) return spec.status();
  if (*in[2] != spec->gathered) {
    return NodeError(node, absl::StrCat("updates ", kernels::ShapeToString(*in[2]), " must be ",
                                        kernels::ShapeToString(spec->gathered)));
  }
  return std::vector<Shape>{*in[0]};
}

TypedOr GatherElementsTyped(const Graph& graph, const Node& node, const TypedIn& in) {
  auto positions = ElementsPositions(graph, node, *in[0], *in[1]);
  if (!positions.ok()) return positions.status();
  return OneT(GatherAt(*in[0], in[1]->shape, *positions, 1));
}

TypedOr ScatterElementsTyped(const Graph& graph, const Node& node, const TypedIn& in) {
  if (auto s = ScatterElementsShapes(graph, node, {&in[0]->shape, &in[1]->shape, &in[2]->shape});
      !s.ok()) {
    return s.status();
  }
  auto positions = ElementsPositions(graph, node, *in[0], *in[1]);
  if (!positions.ok()) return positions.status();
  return OneT(ScatterAt(node, *in[0], *in[2], *positions, 1));
}

TypedOr GatherNDTyped(const Graph& graph, const Node& node, const TypedIn& in) {
  auto spec = NdSpecOf(node, in[0]->shape, in[1]->shape);
  if (!spec.ok()) return spec.status();
  if (absl::Status s = CheckShape(node, spec->gathered, "the output"); !s.ok()) return s;
  auto positions = NdPositions(graph, node, *in[0], *in[1], *spec);
  if (!positions.ok()) return positions.status();
  return OneT(GatherAt(*in[0], spec->gathered, *positions, spec->slice));
}

TypedOr ScatterNDTyped(const Graph& graph, const Node& node, const TypedIn& in) {
  if (auto s = ScatterNDShapes(graph, node, {&in[0]->shape, &in[1]->shape, &in[2]->shape});
      !s.ok()) {
    return s.status();
  }
  auto spec = NdSpecOf(node, in[0]->shape, in[1]->shape);
  auto positions = NdPositions(graph, node, *in[0], *in[1], *spec);
  if (!positions.ok()) return positions.status();
  return OneT(ScatterAt(node, *in[0], *in[2], *positions, spec->slice));
}

template <TypedOr (*kRun)(const Graph&, const Node&, const TypedIn&)>
TensorsOr Reference(const Graph& graph, const Node& node, const std::vector<const Tensor*>& in) {
  return FloatThroughTyped(graph, node, in, kRun);
}

absl::Status GatherAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  if (absl::Status s = IndicesType(node, in[1]); !s.ok()) return s;
  if (out[0] != in[0]) return Refuse(node, out[0], "the output");
  return absl::OkStatus();
}

absl::Status ScatterAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = GatherAccepts(node, in, out); !s.ok()) return s;
  if (in[2] != in[0]) return Refuse(node, in[2], "updates (not the data's type)");
  auto r = ReductionOf(node);
  if (!r.ok()) return r.status();
  if (*r != Reduction::kNone && !Numeric(in[0])) return Refuse(node, in[0], "data to reduce");
  return absl::OkStatus();
}

const TypedRow kScatterTypedRows[] = {
    {"GatherElements", GatherElementsTyped, GatherAccepts},
    {"ScatterElements", ScatterElementsTyped, ScatterAccepts},
    {"GatherND", GatherNDTyped, GatherAccepts},
    {"ScatterND", ScatterNDTyped, ScatterAccepts},
};

}  // namespace

void AddScatterOps(std::vector<OpSchema>& table) {
  table.push_back({"GatherElements", GatherValidate, GatherElementsShapes,
                   Reference<GatherElementsTyped>, NoFlops});
  table.push_back({"ScatterElements", ScatterValidate, ScatterElementsShapes,
                   Reference<ScatterElementsTyped>, NoFlops});
  table.push_back({"GatherND", GatherValidate, GatherNDShapes, Reference<GatherNDTyped>, NoFlops});
  table.push_back(
      {"ScatterND", ScatterValidate, ScatterNDShapes, Reference<ScatterNDTyped>, NoFlops});
  SetTypedRows(table, kScatterTypedRows);
}

}  // namespace numaserve::engine::ops
