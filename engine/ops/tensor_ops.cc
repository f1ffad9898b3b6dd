// Op table rows for data movement and shape ops: Transpose, Concat, Split,
// Slice, Gather, Pad, Expand, Tile, Squeeze, Unsqueeze, Shape,
// ConstantOfShape, Cast, Dropout, DepthToSpace, SpaceToDepth (Resize and
// Upsample are in resize_ops.cc). Integer operands (indices, pads, axes,
// shapes) must be constants; constant folding makes shape arithmetic free.
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"
#include "kernels/ref/layout_ref.h"
#include "kernels/shape_ops.h"

namespace numaserve::engine::ops {
namespace {

// --- Transpose ----------------------------------------------------------------------

absl::StatusOr<std::vector<int64_t>> PermOf(const Node& node, size_t rank) {
  std::vector<int64_t> perm(rank);
  for (size_t i = 0; i < rank; ++i) perm[i] = static_cast<int64_t>(rank - 1 - i);
  perm = node.GetInts("perm", perm);
  std::vector<bool> seen(rank, false);
  if (perm.size() != rank) return NodeError(node, "perm must list every dim once");
  for (int64_t& p : perm) {
    if (p < 0) p += static_cast<int64_t>(rank);
    if (p < 0 || p >= static_cast<int64_t>(rank) || seen[p]) {
      return NodeError(node, "perm must list every dim once");
    }
    seen[p] = true;
  }
  return perm;
}

ShapesOr TransposeShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  auto perm = PermOf(node, in[0]->size());
  if (!perm.ok()) return perm.status();
  Shape out;
  for (int64_t p : *perm) out.push_back((*in[0])[p]);
  return std::vector<Shape>{out};
}

TensorsOr TransposeReference(const Graph&, const Node& node, const std::vector<const Tensor*>& in) {
  auto perm = PermOf(node, in[0]->shape.size());
  if (!perm.ok()) return perm.status();
  return One(kernels::TransposeRef(*in[0], *perm));
}

absl::Status OneInput(const Graph&, const Node& node) { return CheckArity(node, 1, 1); }

// --- Concat -------------------------------------------------------------------------------

absl::Status ConcatValidate(const Graph&, const Node& node) {
  if (absl::Status s = CheckArity(node, 1, 1024); !s.ok()) return s;
  if (!node.HasAttribute("axis")) return NodeError(node, "axis is required");
  for (ValueId v : node.inputs) {
    if (v == kNoValue) return NodeError(node, "inputs may not be omitted");
  }
  return absl::OkStatus();
}

ShapesOr ConcatShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  const int64_t rank = static_cast<int64_t>(in[0]->size());
  auto axis = kernels::NormalizeAxis(node.GetInt("axis", 0), rank);
  if (!axis.ok()) return NodeError(node, axis.status().message());
  Shape out = *in[0];
  for (size_t i = 1; i < in.size(); ++i) {
    if (static_cast<int64_t>(in[i]->size()) != rank) return NodeError(node, "ranks differ");
    for (int64_t d = 0; d < rank; ++d) {
      if (d != *axis && (*in[i])[d] != out[d]) {
        return NodeError(
            node, absl::StrCat("inputs differ in dim ", d, ": ", kernels::ShapeToString(*in[i]),
                               " vs ", kernels::ShapeToString(*in[0])));
      }
    }
    auto sum = NodeAdd(node, out[*axis], (*in[i])[*axis], "the concatenated dim");
    if (!sum.ok()) return sum.status();
    out[*axis] = *sum;
  }
  if (absl::Status s = CheckShape(node, out, "the output"); !s.ok()) return s;
  return std::vector<Shape>{out};
}

TensorsOr ConcatReference(const Graph&, const Node& node, const std::vector<const Tensor*>& in) {
  const int64_t axis = *kernels::NormalizeAxis(node.GetInt("axis", 0), in[0]->rank());
  return One(kernels::ConcatRef(in, axis));
}

// --- Split ----------------------------------------------------------------------------------

absl::StatusOr<std::vector<int64_t>> SplitSizes(const Graph& graph, const Node& node,
                                                const Shape& x, int64_t* axis_out) {
  auto axis = kernels::NormalizeAxis(node.GetInt("axis", 0), static_cast<int64_t>(x.size()));
  if (!axis.ok()) return NodeError(node, axis.status().message());
  *axis_out = *axis;
  auto split = IntsFromAttrOrInput(graph, node, "split", 1);
  if (!split.ok()) return split.status();
  const int64_t parts = static_cast<int64_t>(node.outputs.size());
  std::vector<int64_t> sizes;
  const auto& given = *split;  // no split, or the sizes given
  if (given.has_value()) {
    sizes = *given;
  } else if (node.HasAttribute("num_outputs")) {
    // Opset 18: parts of ceil(dim / num_outputs), the last one what is left
    // (smaller, or negative and refused below).
    if (node.GetInt("num_outputs", 0) != parts) {
      return NodeError(node, absl::StrCat("num_outputs is ", node.GetInt("num_outputs", 0),
                                          "; the node has ", parts, " outputs"));
    }
    const int64_t chunk = x[*axis] / parts + (x[*axis] % parts != 0 ? 1 : 0);
    sizes.assign(parts, chunk);
    sizes.back() = x[*axis] - chunk * (parts - 1);
  } else {
    if (x[*axis] % parts != 0) {
      return NodeError(
          node, absl::StrCat("dim ", x[*axis], " does not split into ", parts, " equal parts"));
    }
    sizes.assign(parts, x[*axis] / parts);
  }
  int64_t total = 0;
  bool valid = true;  // no negative size, no overflowing sum
  for (int64_t s : sizes) valid = valid && s >= 0 && !__builtin_add_overflow(total, s, &total);
  if (!valid || static_cast<int64_t>(sizes.size()) != parts || total != x[*axis]) {
    return NodeError(node,
                     absl::StrCat("split sizes must be ", parts, " values summing to ", x[*axis]));
  }
  return sizes;
}

absl::Status SplitValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 1, 2, 1, 1024); !s.ok()) return s;
  return IntsFromAttrOrInput(graph, node, "split", 1).status();
}

ShapesOr SplitShapes(const Graph& graph, const Node& node, const std::vector<const Shape*>& in) {
  int64_t axis = 0;
  auto sizes = SplitSizes(graph, node, *in[0], &axis);
  if (!sizes.ok()) return sizes.status();
  std::vector<Shape> out;
  for (int64_t s : *sizes) {
    Shape o = *in[0];
    o[axis] = s;
    out.push_back(o);
  }
  return out;
}

TensorsOr SplitReference(const Graph& graph, const Node& node,
                         const std::vector<const Tensor*>& in) {
  int64_t axis = 0;
  auto sizes = SplitSizes(graph, node, in[0]->shape, &axis);
  if (!sizes.ok()) return sizes.status();
  return kernels::SplitRef(*in[0], axis, *sizes);
}

// --- Slice ------------------------------------------------------------------------------------

struct SliceSpec {
  std::vector<int64_t> starts, steps;  // per dim
  Shape out;
};

absl::StatusOr<SliceSpec> SliceSpecOf(const Graph& graph, const Node& node, const Shape& x) {
  auto starts = IntsFromAttrOrInput(graph, node, "starts", 1);
  auto ends = IntsFromAttrOrInput(graph, node, "ends", 2);
  auto axes = IntsFromAttrOrInput(graph, node, "axes", 3);
  auto steps = ConstInts(graph, node, 4, "steps");
  for (const auto* s : {&starts, &ends, &axes, &steps}) {
    if (!s->ok()) return s->status();
  }
  const auto& given_starts = *starts;
  const auto& given_ends = *ends;
  const auto& given_axes = *axes;
  const auto& given_steps = *steps;
  if (!given_starts.has_value() || !given_ends.has_value() ||
      given_starts->size() != given_ends->size()) {
    return NodeError(node, "starts and ends are required and must have the same length");
  }
  const int64_t rank = static_cast<int64_t>(x.size());
  const size_t n = given_starts->size();
  std::vector<int64_t> ax(n);
  for (size_t i = 0; i < n; ++i) ax[i] = static_cast<int64_t>(i);
  if (given_axes.has_value()) ax = *given_axes;
  std::vector<int64_t> st(n, 1);
  if (given_steps.has_value()) st = *given_steps;
  if (ax.size() != n || st.size() != n) return NodeError(node, "axes/steps length differs");
  SliceSpec spec;
  spec.starts.assign(rank, 0);
  spec.steps.assign(rank, 1);
  spec.out = x;
  for (size_t i = 0; i < n; ++i) {
    auto a = kernels::NormalizeAxis(ax[i], rank);
    if (!a.ok()) return NodeError(node, a.status().message());
    const int64_t dim = x[*a], step = st[i];
    if (step == 0) return NodeError(node, "steps may not be 0");
    int64_t start = (*given_starts)[i], end = (*given_ends)[i];
    if (start < 0)
      start = std::max<int64_t>(start + dim, std::numeric_limits<int64_t>::min() + dim);
    if (end < 0) end += dim;
    // ceil(distance / |step|) without overflow for any step (INT64_MIN too).
    int64_t len = 0;
    const uint64_t stride =
        step > 0 ? static_cast<uint64_t>(step) : 0 - static_cast<uint64_t>(step);
    if (step > 0) {
      start = std::clamp<int64_t>(start, 0, dim);
      end = std::clamp<int64_t>(end, 0, dim);
      if (end > start)
        len = static_cast<int64_t>((static_cast<uint64_t>(end - start) - 1) / stride + 1);
    } else {
      start = std::clamp<int64_t>(start, 0, dim - 1);
      end = std::clamp<int64_t>(end, -1, dim - 1);
      if (start > end)
        len = static_cast<int64_t>((static_cast<uint64_t>(start - end) - 1) / stride + 1);
    }
    spec.starts[*a] = start;
    spec.steps[*a] = step;
    spec.out[*a] = len;
  }
  return spec;
}

absl::Status SliceValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 1, 5); !s.ok()) return s;
  for (size_t i = 1; i < 5; ++i) {
    if (absl::Status s = ConstInts(graph, node, i, "slice parameter").status(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

ShapesOr SliceShapes(const Graph& graph, const Node& node, const std::vector<const Shape*>& in) {
  auto spec = SliceSpecOf(graph, node, *in[0]);
  if (!spec.ok()) return spec.status();
  return std::vector<Shape>{spec->out};
}

TensorsOr SliceReference(const Graph& graph, const Node& node,
                         const std::vector<const Tensor*>& in) {
  auto spec = SliceSpecOf(graph, node, in[0]->shape);
  if (!spec.ok()) return spec.status();
  return One(kernels::StridedSliceRef(*in[0], spec->starts, spec->steps, spec->out));
}

// --- Gather ----------------------------------------------------------------------------------

// Constant indices run on the FP32 reference; runtime INT64/INT32 indices
// on the typed one (engine/ops/typed_ops.cc).
absl::Status GatherValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 2, 2); !s.ok()) return s;
  if (node.inputs[1] == kNoValue) return NodeError(node, "indices are required");
  if (!graph.IsConstant(node.inputs[1])) return absl::OkStatus();
  return ConstInts(graph, node, 1, "indices").status();
}

ShapesOr GatherShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  const Shape& x = *in[0];
  auto axis = kernels::NormalizeAxis(node.GetInt("axis", 0), static_cast<int64_t>(x.size()));
  if (!axis.ok()) return NodeError(node, axis.status().message());
  Shape out(x.begin(), x.begin() + *axis);
  out.insert(out.end(), in[1]->begin(), in[1]->end());
  out.insert(out.end(), x.begin() + *axis + 1, x.end());
  return std::vector<Shape>{out};
}

TensorsOr GatherReference(const Graph& graph, const Node& node,
                          const std::vector<const Tensor*>& in) {
  const int64_t axis = *kernels::NormalizeAxis(node.GetInt("axis", 0), in[0]->rank());
  auto indices = ConstInts(graph, node, 1, "indices");
  if (!indices.ok()) return indices.status();
  const auto& given = *indices;
  if (!given.has_value()) return NodeError(node, "indices are required");
  std::vector<int64_t> idx = *given;
  const Shape& index_shape = graph.FindConstant(node.inputs[1])->shape;
  if (auto shapes = GatherShapes(graph, node, {&in[0]->shape, &index_shape}); !shapes.ok()) {
    return shapes.status();
  } else if (absl::Status s = CheckShape(node, (*shapes)[0], "the output"); !s.ok()) {
    return s;
  }
  const int64_t dim = in[0]->shape[axis];
  for (int64_t& i : idx) {
    if (i < 0) i += dim;
    if (i < 0 || i >= dim) return NodeError(node, absl::StrCat("index out of range for dim ", dim));
  }
  return One(kernels::GatherRef(*in[0], axis, idx, graph.FindConstant(node.inputs[1])->shape));
}

// --- Pad ----------------------------------------------------------------------------------------

struct PadSpec {
  std::vector<int64_t> pads;
  kernels::PadMode mode = kernels::PadMode::kConstant;
  float value = 0.0f;
};

absl::StatusOr<PadSpec> PadSpecOf(const Graph& graph, const Node& node, size_t rank) {
  PadSpec spec;
  auto pads = IntsFromAttrOrInput(graph, node, "pads", 1);
  if (!pads.ok()) return pads.status();
  const auto& given = *pads;
  // Opset 18's axes (input 3, a constant): pads hold the begins, then the
  // ends, of those axes only; the others are not padded.
  auto axes = ConstInts(graph, node, 3, "axes");
  if (!axes.ok()) return axes.status();
  const auto& given_axes = *axes;
  if (HasInput(node, 3) && !given_axes.has_value()) {
    return NodeUnsupported(node, "axes must be a constant");
  }
  const size_t padded = given_axes.has_value() ? given_axes->size() : rank;
  if (!given.has_value() || given->size() != 2 * padded) {
    return NodeError(node, absl::StrCat("pads must have ", 2 * padded, " values"));
  }
  if (!given_axes.has_value()) {
    spec.pads = *given;
  } else {
    spec.pads.assign(2 * rank, 0);
    std::vector<bool> seen(rank, false);
    for (size_t i = 0; i < padded; ++i) {
      auto a = kernels::NormalizeAxis((*given_axes)[i], static_cast<int64_t>(rank));
      if (!a.ok()) return NodeError(node, a.status().message());
      if (seen[*a]) return NodeError(node, absl::StrCat("axis ", *a, " is repeated in axes"));
      seen[*a] = true;
      spec.pads[*a] = (*given)[i];
      spec.pads[rank + *a] = (*given)[padded + i];
    }
  }
  const std::string mode = node.GetString("mode", "constant");
  if (mode == "reflect") {
    spec.mode = kernels::PadMode::kReflect;
  } else if (mode == "edge") {
    spec.mode = kernels::PadMode::kEdge;
  } else if (mode != "constant") {
    return NodeUnsupported(node, absl::StrCat("mode '", mode, "' is not supported"));
  }
  spec.value = node.GetFloat("value", 0.0f);
  // A runtime constant_value is read by the reference from its tensor.
  if (HasInput(node, 2) && !graph.IsConstant(node.inputs[2])) return spec;
  auto value = ConstFloats(graph, node, 2, "constant_value");
  if (!value.ok()) return value.status();
  const auto& given_value = *value;
  if (given_value.has_value() && !given_value->empty()) spec.value = (*given_value)[0];
  return spec;
}

absl::Status PadValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 1, 4); !s.ok()) return s;
  return IntsFromAttrOrInput(graph, node, "pads", 1).status();
}

ShapesOr PadShapes(const Graph& graph, const Node& node, const std::vector<const Shape*>& in) {
  auto spec = PadSpecOf(graph, node, in[0]->size());
  if (!spec.ok()) return spec.status();
  Shape out = *in[0];
  for (size_t d = 0; d < out.size(); ++d) {
    // Negative pads crop; the result may be neither negative nor overflow.
    const int64_t begin = spec->pads[d], end = spec->pads[d + out.size()];
    int64_t dim = 0;
    if (__builtin_add_overflow(out[d], begin, &dim) || __builtin_add_overflow(dim, end, &dim) ||
        dim < 0) {
      return NodeError(node, absl::StrCat("pads ", begin, " and ", end, " on dim ", d, " of ",
                                          kernels::ShapeToString(*in[0]),
                                          " give a negative or overflowing extent"));
    }
    out[d] = dim;
  }
  if (absl::Status s = CheckShape(node, out, "the padded output"); !s.ok()) return s;
  return std::vector<Shape>{out};
}

TensorsOr PadReference(const Graph& graph, const Node& node, const std::vector<const Tensor*>& in) {
  if (auto shapes = PadShapes(graph, node, {&in[0]->shape}); !shapes.ok()) return shapes.status();
  auto spec = PadSpecOf(graph, node, in[0]->shape.size());
  if (!spec.ok()) return spec.status();
  if (in.size() > 2 && in[2] != nullptr && !in[2]->data.empty()) spec->value = in[2]->data[0];
  return One(kernels::PadRef(*in[0], spec->pads, spec->mode, spec->value));
}

// --- Expand, Tile ------------------------------------------------------------------------------

absl::Status SecondInputConst(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 2, 2); !s.ok()) return s;
  return ConstInts(graph, node, 1, "shape/repeats").status();
}

ShapesOr ExpandShapes(const Graph& graph, const Node& node, const std::vector<const Shape*>& in) {
  auto shape = ConstInts(graph, node, 1, "shape");
  if (!shape.ok()) return shape.status();
  const auto& given = *shape;
  if (!given.has_value()) return NodeError(node, "shape is required");
  if (absl::Status s = CheckShape(node, *given, "the shape input"); !s.ok()) return s;
  auto out = kernels::BroadcastShapes(*in[0], *given);
  if (!out.ok()) return NodeError(node, out.status().message());
  if (absl::Status s = CheckShape(node, *out, "the expanded output"); !s.ok()) return s;
  return std::vector<Shape>{*out};
}

TensorsOr ExpandReference(const Graph& graph, const Node& node,
                          const std::vector<const Tensor*>& in) {
  auto shapes = ExpandShapes(graph, node, {&in[0]->shape});
  if (!shapes.ok()) return shapes.status();
  return One(kernels::ExpandRef(*in[0], (*shapes)[0]));
}

ShapesOr TileShapes(const Graph& graph, const Node& node, const std::vector<const Shape*>& in) {
  auto repeats = ConstInts(graph, node, 1, "repeats");
  if (!repeats.ok()) return repeats.status();
  const auto& given = *repeats;
  if (!given.has_value()) return NodeError(node, "repeats are required");
  if (given->size() != in[0]->size()) return NodeError(node, "repeats length != rank");
  Shape out = *in[0];
  for (size_t d = 0; d < out.size(); ++d) {
    const int64_t r = (*given)[d];
    if (r < 0) return NodeError(node, absl::StrCat("repeats[", d, "] is negative (", r, ")"));
    auto dim = NodeMul(node, out[d], r, absl::StrCat("dim ", d, " times repeats[", d, "]"));
    if (!dim.ok()) return dim.status();
    out[d] = *dim;
  }
  if (absl::Status s = CheckShape(node, out, "the tiled output"); !s.ok()) return s;
  return std::vector<Shape>{out};
}

TensorsOr TileReference(const Graph& graph, const Node& node,
                        const std::vector<const Tensor*>& in) {
  // The output's size is checked before anything is allocated.
  if (auto shapes = TileShapes(graph, node, {&in[0]->shape}); !shapes.ok()) {
    return shapes.status();
  }
  auto repeats = ConstInts(graph, node, 1, "repeats");
  if (!repeats.ok()) return repeats.status();
  const auto& given = *repeats;
  if (!given.has_value()) return NodeError(node, "repeats are required");
  return One(kernels::TileRef(*in[0], *given));
}

// --- Squeeze, Unsqueeze (views) ------------------------------------------------------------------

absl::Status AxesValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 1, 2); !s.ok()) return s;
  return IntsFromAttrOrInput(graph, node, "axes", 1).status();
}

ShapesOr SqueezeShapes(const Graph& graph, const Node& node, const std::vector<const Shape*>& in) {
  const Shape& x = *in[0];
  auto axes = IntsFromAttrOrInput(graph, node, "axes", 1);
  if (!axes.ok()) return axes.status();
  std::vector<bool> drop(x.size(), false);
  if (const auto& given = *axes; given.has_value()) {
    auto n = NormalizeAxes(node, *given, static_cast<int64_t>(x.size()));
    if (!n.ok()) return n.status();
    for (int64_t a : *n) {
      if (x[a] != 1) return NodeError(node, absl::StrCat("dim ", a, " is ", x[a], ", not 1"));
      drop[a] = true;
    }
  } else {
    for (size_t d = 0; d < x.size(); ++d) drop[d] = x[d] == 1;
  }
  Shape out;
  for (size_t d = 0; d < x.size(); ++d) {
    if (!drop[d]) out.push_back(x[d]);
  }
  return std::vector<Shape>{out};
}

ShapesOr UnsqueezeShapes(const Graph& graph, const Node& node,
                         const std::vector<const Shape*>& in) {
  const Shape& x = *in[0];
  auto axes = IntsFromAttrOrInput(graph, node, "axes", 1);
  if (!axes.ok()) return axes.status();
  const auto& given = *axes;
  if (!given.has_value()) return NodeError(node, "axes are required");
  const int64_t out_rank = static_cast<int64_t>(x.size() + given->size());
  auto n = NormalizeAxes(node, *given, out_rank);
  if (!n.ok()) return n.status();
  std::vector<bool> inserted(out_rank, false);
  for (int64_t a : *n) {
    if (inserted[a]) return NodeError(node, "axes repeat");
    inserted[a] = true;
  }
  Shape out;
  size_t next = 0;
  for (int64_t d = 0; d < out_rank; ++d) out.push_back(inserted[d] ? 1 : x[next++]);
  return std::vector<Shape>{out};
}

// A view: the data unchanged under the inferred shape.
TensorsOr ViewReference(const Graph& graph, const Node& node,
                        const std::vector<const Tensor*>& in) {
  auto shapes = FindOpSchema(node.op_type)->infer_shapes(graph, node, {&in[0]->shape});
  if (!shapes.ok()) return shapes.status();
  return One(Tensor((*shapes)[0], in[0]->data));
}

// --- Shape, ConstantOfShape, Cast, Dropout ------------------------------------------------------

std::pair<int64_t, int64_t> ShapeRange(const Node& node, int64_t rank) {
  int64_t start = node.GetInt("start", 0), end = node.GetInt("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::clamp<int64_t>(end, 0, rank);
  return {start, std::max(start, end)};
}

ShapesOr ShapeShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  auto [start, end] = ShapeRange(node, static_cast<int64_t>(in[0]->size()));
  return std::vector<Shape>{{end - start}};
}

TensorsOr ShapeReference(const Graph&, const Node& node, const std::vector<const Tensor*>& in) {
  auto [start, end] = ShapeRange(node, in[0]->rank());
  Tensor y({end - start});
  for (int64_t d = start; d < end; ++d) y.data[d - start] = static_cast<float>(in[0]->shape[d]);
  return One(std::move(y));
}

ShapesOr SizeShapes(const Graph&, const Node&, const std::vector<const Shape*>&) {
  return std::vector<Shape>{Shape{}};
}

TensorsOr SizeReference(const Graph&, const Node&, const std::vector<const Tensor*>& in) {
  return One(Tensor(Shape{}, {static_cast<float>(in[0]->size())}));
}

absl::Status ConstantOfShapeValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 1, 1); !s.ok()) return s;
  return ConstInts(graph, node, 0, "shape").status();
}

ShapesOr ConstantOfShapeShapes(const Graph& graph, const Node& node,
                               const std::vector<const Shape*>&) {
  auto shape = ConstInts(graph, node, 0, "shape");
  if (!shape.ok()) return shape.status();
  const auto& given = *shape;
  if (!given.has_value()) return NodeError(node, "shape is required");
  if (absl::Status s = CheckShape(node, *given, "the shape input"); !s.ok()) return s;
  return std::vector<Shape>{*given};
}

TensorsOr ConstantOfShapeReference(const Graph& graph, const Node& node,
                                   const std::vector<const Tensor*>&) {
  auto shape = ConstInts(graph, node, 0, "shape");
  if (!shape.ok()) return shape.status();
  const auto& given = *shape;
  if (!given.has_value()) return NodeError(node, "shape is required");
  if (absl::Status s = CheckShape(node, *given, "the shape input"); !s.ok()) return s;
  const std::vector<float> value = node.GetFloats("value", {0.0f});
  Tensor y(*given);
  std::fill(y.data.begin(), y.data.end(), value.empty() ? 0.0f : value[0]);
  return One(std::move(y));
}

// ONNX TensorProto element types a Cast may target here: values are held as
// FP32, integer targets truncate and BOOL becomes 0/1.
absl::Status CastValidate(const Graph&, const Node& node) {
  if (absl::Status s = CheckArity(node, 1, 1); !s.ok()) return s;
  const int64_t to = node.GetInt("to", 0);
  // FLOAT=1 UINT8=2 INT8=3 UINT16=4 INT16=5 INT32=6 INT64=7 BOOL=9 DOUBLE=11 UINT32=12 UINT64=13
  // FLOAT16=10 BFLOAT16=16: on the typed reference (engine/ops/typed_ops.cc).
  const bool ok = to == 1 || (to >= 2 && to <= 7) || to == 9 || to == 10 || to == 11 || to == 12 ||
                  to == 13 || to == 16;
  if (!ok) return NodeUnsupported(node, absl::StrCat("cast to element type ", to));
  return absl::OkStatus();
}

TensorsOr CastReference(const Graph&, const Node& node, const std::vector<const Tensor*>& in) {
  const int64_t to = node.GetInt("to", 1);
  Tensor y = *in[0];
  if (to == 9) {
    for (float& v : y.data) v = v != 0.0f ? 1.0f : 0.0f;
  } else if (to != 1 && to != 11) {
    for (float& v : y.data) v = std::trunc(v);
  }
  return One(std::move(y));
}

absl::Status DropoutValidate(const Graph& graph, const Node& node) {
  // The optional mask output (BOOL, all true at inference) is typed.
  if (absl::Status s = CheckArity(node, 1, 3, 1, 2); !s.ok()) return s;
  if (node.GetInt("is_test", 1) == 0 && graph.opset() < 7) {
    return NodeUnsupported(node, "training-mode dropout is not supported");
  }
  auto training = ConstInts(graph, node, 2, "training_mode");
  if (!training.ok()) return training.status();
  const auto& given = *training;
  if (given.has_value() && !given->empty() && (*given)[0] != 0) {
    return NodeUnsupported(node, "training_mode=true is not supported (inference only)");
  }
  return absl::OkStatus();
}

TensorsOr IdentityReference(const Graph&, const Node&, const std::vector<const Tensor*>& in) {
  return One(*in[0]);
}

// Output and mask have the input's shape.
ShapesOr DropoutShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  return std::vector<Shape>(node.outputs.size(), *in[0]);
}

// --- DepthToSpace / SpaceToDepth
// ---------------------------------------------------------------------

absl::Status BlockValidate(const Graph&, const Node& node) {
  if (absl::Status s = CheckArity(node, 1, 1); !s.ok()) return s;
  const int64_t b = node.GetInt("blocksize", 0);
  if (b < 1 || b > kernels::kMaxTensorElements) {
    return NodeError(node, absl::StrCat("blocksize must be in 1..", kernels::kMaxTensorElements));
  }
  return absl::OkStatus();
}

ShapesOr BlockShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  const Shape& x = *in[0];
  const int64_t b = node.GetInt("blocksize", 1);
  if (x.size() != 4) return NodeError(node, "input must be 4-D");
  // Dims and b are at most kMaxTensorElements (2^31): these products fit.
  if (b < 1 || b > kernels::kMaxTensorElements) return NodeError(node, "blocksize out of range");
  Shape out;
  if (node.op_type == "DepthToSpace") {
    if (x[1] % (b * b) != 0) return NodeError(node, "channels not divisible by blocksize^2");
    out = {x[0], x[1] / (b * b), x[2] * b, x[3] * b};
  } else {
    if (x[2] % b != 0 || x[3] % b != 0) return NodeError(node, "H, W not divisible by blocksize");
    auto c = NodeMul(node, x[1] * b, b, "channels times blocksize^2");
    if (!c.ok()) return c.status();
    out = {x[0], *c, x[2] / b, x[3] / b};
  }
  if (absl::Status s = CheckShape(node, out, "the output"); !s.ok()) return s;
  return std::vector<Shape>{out};
}

TensorsOr BlockReference(const Graph&, const Node& node, const std::vector<const Tensor*>& in) {
  const Shape& x = in[0]->shape;
  const int64_t b = node.GetInt("blocksize", 1);
  Tensor t = *in[0];
  if (node.op_type == "DepthToSpace") {
    const bool crd = node.GetString("mode", "DCR") == "CRD";
    const int64_t c = x[1] / (b * b);
    t.shape = crd ? Shape{x[0], c, b, b, x[2], x[3]} : Shape{x[0], b, b, c, x[2], x[3]};
    Tensor y = kernels::TransposeRef(
        t, crd ? std::vector<int64_t>{0, 1, 4, 2, 5, 3} : std::vector<int64_t>{0, 3, 4, 1, 5, 2});
    y.shape = {x[0], c, x[2] * b, x[3] * b};
    return One(std::move(y));
  }
  t.shape = {x[0], x[1], x[2] / b, b, x[3] / b, b};
  Tensor y = kernels::TransposeRef(t, {0, 3, 5, 1, 2, 4});
  y.shape = {x[0], x[1] * b * b, x[2] / b, x[3] / b};
  return One(std::move(y));
}

}  // namespace

void AddTensorOps(std::vector<OpSchema>& table) {
  table.push_back({"Transpose", OneInput, TransposeShapes, TransposeReference, NoFlops});
  table.push_back({"Concat", ConcatValidate, ConcatShapes, ConcatReference, NoFlops});
  table.push_back({"Split", SplitValidate, SplitShapes, SplitReference, NoFlops});
  table.push_back({"Slice", SliceValidate, SliceShapes, SliceReference, NoFlops});
  table.push_back({"Gather", GatherValidate, GatherShapes, GatherReference, NoFlops});
  table.push_back({"Pad", PadValidate, PadShapes, PadReference, NoFlops});
  table.push_back({"Expand", SecondInputConst, ExpandShapes, ExpandReference, NoFlops});
  table.push_back({"Tile", SecondInputConst, TileShapes, TileReference, NoFlops});
  table.push_back({"Squeeze", AxesValidate, SqueezeShapes, ViewReference, NoFlops});
  table.push_back({"Unsqueeze", AxesValidate, UnsqueezeShapes, ViewReference, NoFlops});
  table.push_back({"Shape", OneInput, ShapeShapes, ShapeReference, NoFlops});
  table.push_back({"Size", OneInput, SizeShapes, SizeReference, NoFlops});
  table.push_back({"ConstantOfShape", ConstantOfShapeValidate, ConstantOfShapeShapes,
                   ConstantOfShapeReference, NoFlops});
  table.push_back({"Cast", CastValidate, SameShape, CastReference, NoFlops});
  table.push_back({"Dropout", DropoutValidate, DropoutShapes, IdentityReference, NoFlops});
  table.push_back({"DepthToSpace", BlockValidate, BlockShapes, BlockReference, NoFlops});
  table.push_back({"SpaceToDepth", BlockValidate, BlockShapes, BlockReference, NoFlops});
}

}  // namespace numaserve::engine::ops
