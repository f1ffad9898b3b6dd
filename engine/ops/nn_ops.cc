// Op table rows for convolution, pooling and BatchNormalization.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"
#include "kernels/ref/conv_ref.h"
#include "kernels/ref/norm_ref.h"
#include "kernels/shape_ops.h"

namespace numaserve::engine::ops {
namespace {

// Window attributes are the model's: extents, strides and dilations must be
// in 1..kMaxTensorElements and pads within +-kMaxTensorElements, so that the
// window arithmetic below (on dims that are at most as large) fits int64.
absl::Status CheckWindowAttributes(const Node& node, const std::vector<int64_t>& kernel,
                                   const std::vector<int64_t>& strides,
                                   const std::vector<int64_t>& dilations,
                                   const std::vector<int64_t>& pads) {
  constexpr int64_t kMax = kernels::kMaxTensorElements;
  for (const auto* values : {&kernel, &strides, &dilations}) {
    for (int64_t v : *values) {
      if (v < 1 || v > kMax) {
        return NodeError(node, absl::StrCat("strides, dilations and kernel extents must be in 1..",
                                            kMax, ", got ", v));
      }
    }
  }
  for (int64_t v : pads) {
    if (v < -kMax || v > kMax) {
      return NodeError(node, absl::StrCat("pads must be within +-", kMax, ", got ", v));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<kernels::WindowParams> ResolveWindow(const Node& node, const Shape& input,
                                                    const std::vector<int64_t>& kernel) {
  if (input.size() < 3 || input.size() > 5) {
    return NodeUnsupported(
        node, absl::StrCat("supports 1-3 spatial dims, input is ", kernels::ShapeToString(input)));
  }
  const size_t spatial = input.size() - 2;
  kernels::WindowParams p;
  p.kernel = kernel;
  p.strides = node.GetInts("strides", std::vector<int64_t>(spatial, 1));
  p.dilations = node.GetInts("dilations", std::vector<int64_t>(spatial, 1));
  std::vector<int64_t> pads = node.GetInts("pads", std::vector<int64_t>(2 * spatial, 0));
  if (p.kernel.size() != spatial || p.strides.size() != spatial || p.dilations.size() != spatial ||
      pads.size() != 2 * spatial) {
    return NodeError(node, absl::StrCat("kernel_shape/strides/dilations/pads must cover ", spatial,
                                        " spatial dims"));
  }
  if (absl::Status s = CheckWindowAttributes(node, p.kernel, p.strides, p.dilations, pads);
      !s.ok()) {
    return s;
  }
  p.pads_begin.assign(pads.begin(), pads.begin() + spatial);
  p.pads_end.assign(pads.begin() + spatial, pads.end());
  const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  if (auto_pad == "VALID") {
    std::fill(p.pads_begin.begin(), p.pads_begin.end(), 0);
    std::fill(p.pads_end.begin(), p.pads_end.end(), 0);
  } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    for (size_t d = 0; d < spatial; ++d) {
      const int64_t in = input[d + 2], s = p.strides[d];
      const int64_t out = (in + s - 1) / s;
      const int64_t eff = (p.kernel[d] - 1) * p.dilations[d] + 1;
      const int64_t total = std::max<int64_t>(0, (out - 1) * s + eff - in);
      const int64_t small = total / 2;
      p.pads_begin[d] = auto_pad == "SAME_UPPER" ? small : total - small;
      p.pads_end[d] = total - p.pads_begin[d];
    }
  } else if (auto_pad != "NOTSET") {
    return NodeError(node, absl::StrCat("unknown auto_pad '", auto_pad, "'"));
  }
  for (size_t d = 0; d < spatial; ++d) {
    if (p.strides[d] < 1 || p.dilations[d] < 1 || p.kernel[d] < 1) {
      return NodeError(node, "strides, dilations and kernel extents must be >= 1");
    }
  }
  return p;
}

namespace {

// Spatial output extents of a conv/pool window.
Shape WindowOutput(const Shape& input, const kernels::WindowParams& p, bool ceil_mode) {
  Shape out;
  for (size_t d = 0; d < p.kernel.size(); ++d) {
    const int64_t in = input[d + 2];
    const int64_t eff = (p.kernel[d] - 1) * p.dilations[d] + 1;
    const int64_t span = in + p.pads_begin[d] + p.pads_end[d] - eff;
    int64_t o = (ceil_mode ? (span + p.strides[d] - 1) / p.strides[d] : span / p.strides[d]) + 1;
    // A window may not start in the end padding.
    if (ceil_mode && (o - 1) * p.strides[d] >= in + p.pads_begin[d]) --o;
    out.push_back(std::max<int64_t>(o, 0));
  }
  return out;
}

// --- Conv -----------------------------------------------------------------------

absl::Status ConvValidate(const Graph&, const Node& node) {
  if (absl::Status s = CheckArity(node, 2, 3); !s.ok()) return s;
  if (node.GetInt("group", 1) < 1) return NodeError(node, "group must be >= 1");
  return absl::OkStatus();
}

std::vector<int64_t> KernelOf(const Node& node, const Shape& w) {
  return node.GetInts("kernel_shape", std::vector<int64_t>(w.begin() + 2, w.end()));
}

ShapesOr ConvShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  const Shape& x = *in[0];
  const Shape& w = *in[1];
  const int64_t group = node.GetInt("group", 1);
  if (group < 1 || group > kernels::kMaxTensorElements)
    return NodeError(node, "group out of range");
  if (w.size() != x.size() || x.size() < 3) {
    return NodeError(
        node, absl::StrCat("X ", kernels::ShapeToString(x), " and W ", kernels::ShapeToString(w),
                           " must have the same rank >= 3"));
  }
  if (x[1] != w[1] * group || w[0] % group != 0) {
    return NodeError(node, absl::StrCat("channels: X has ", x[1], ", W ", kernels::ShapeToString(w),
                                        " with group ", group));
  }
  if (in.size() > 2 && in[2] != nullptr && kernels::NumElements(*in[2]) != w[0]) {
    return NodeError(node, absl::StrCat("B must have ", w[0], " elements"));
  }
  auto p = ResolveWindow(node, x, KernelOf(node, w));
  if (!p.ok()) return p.status();
  Shape out = {x[0], w[0]};
  for (int64_t o : WindowOutput(x, *p, false)) out.push_back(o);
  return std::vector<Shape>{out};
}

TensorsOr ConvReference(const Graph& graph, const Node& node,
                        const std::vector<const Tensor*>& in) {
  auto shapes = ConvShapes(graph, node, {&in[0]->shape, &in[1]->shape});
  if (!shapes.ok()) return shapes.status();
  auto p = ResolveWindow(node, in[0]->shape, KernelOf(node, in[1]->shape));
  if (!p.ok()) return p.status();
  const Tensor* bias = in.size() > 2 ? in[2] : nullptr;
  return One(kernels::ConvRef(*in[0], *in[1], bias, *p, node.GetInt("group", 1), (*shapes)[0]));
}

double ConvFlops(const Node& node, const std::vector<const Shape*>& in) {
  auto s = ConvShapes(Graph(), node, {in[0], in[1]});
  if (!s.ok()) return 0.0;
  const Shape& w = *in[1];
  return 2.0 * kernels::NumElements((*s)[0]) * (kernels::NumElements(w) / w[0]);
}

// --- ConvTranspose ------------------------------------------------------------------

}  // namespace

absl::StatusOr<ConvTransposeGeometry> ConvTransposeResolve(const Node& node, const Shape& x,
                                                           const Shape& w) {
  const int64_t group = node.GetInt("group", 1);
  if (w.size() != x.size() || x.size() < 3 || x.size() > 5) {
    return NodeError(node, "X and W must have the same rank, 3 to 5");
  }
  if (x[1] != w[0] || x[1] % group != 0) {
    return NodeError(node, absl::StrCat("channels: X has ", x[1], ", W ", kernels::ShapeToString(w),
                                        " with group ", group));
  }
  const size_t spatial = x.size() - 2;
  ConvTransposeGeometry g;
  kernels::WindowParams& p = g.p;
  p.kernel = KernelOf(node, w);
  p.strides = node.GetInts("strides", std::vector<int64_t>(spatial, 1));
  p.dilations = node.GetInts("dilations", std::vector<int64_t>(spatial, 1));
  const std::vector<int64_t> pads = node.GetInts("pads", std::vector<int64_t>(2 * spatial, 0));
  const std::vector<int64_t> out_pad =
      node.GetInts("output_padding", std::vector<int64_t>(spatial, 0));
  std::vector<int64_t> out_shape = node.GetInts("output_shape", {});
  if (out_shape.size() == spatial + 2) out_shape.erase(out_shape.begin(), out_shape.begin() + 2);
  if (p.kernel.size() != spatial || p.strides.size() != spatial || pads.size() != 2 * spatial ||
      out_pad.size() != spatial || p.dilations.size() != spatial ||
      (!out_shape.empty() && out_shape.size() != spatial)) {
    return NodeError(node, "attributes must cover every spatial dim");
  }
  if (absl::Status s = CheckWindowAttributes(node, p.kernel, p.strides, p.dilations, pads);
      !s.ok()) {
    return s;
  }
  for (const std::vector<int64_t>* values :
       std::initializer_list<const std::vector<int64_t>*>{&out_pad, &out_shape}) {
    for (int64_t v : *values) {
      if (v < 0 || v > kernels::kMaxTensorElements) {
        return NodeError(node, absl::StrCat("output_padding and output_shape must be in 0..",
                                            kernels::kMaxTensorElements, ", got ", v));
      }
    }
  }
  if (group < 1 || group > kernels::kMaxTensorElements) {
    return NodeError(node, "group out of range");
  }
  p.pads_begin.assign(pads.begin(), pads.begin() + spatial);
  p.pads_end.assign(pads.begin() + spatial, pads.end());
  const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  g.out = {x[0], w[1] * group};
  for (size_t d = 0; d < spatial; ++d) {
    // Each term is below 2^62 (checked dims and attributes); their sum may
    // not fit.
    const int64_t eff = (p.kernel[d] - 1) * p.dilations[d] + 1;
    int64_t full = 0;
    if (__builtin_add_overflow(p.strides[d] * (x[d + 2] - 1), out_pad[d] + eff, &full)) {
      return NodeError(node,
                       absl::StrCat("the output extent of spatial dim ", d, " overflows int64"));
    }
    if (!out_shape.empty() || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      const int64_t o = !out_shape.empty() ? out_shape[d] : x[d + 2] * p.strides[d];
      const int64_t total = std::max<int64_t>(full - o, 0);
      p.pads_begin[d] = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      if (auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER") p.pads_begin[d] = total / 2;
      p.pads_end[d] = total - p.pads_begin[d];
      g.out.push_back(o);
    } else {
      if (auto_pad == "VALID") p.pads_begin[d] = p.pads_end[d] = 0;
      int64_t o = 0;
      if (__builtin_sub_overflow(full, p.pads_begin[d], &o) ||
          __builtin_sub_overflow(o, p.pads_end[d], &o)) {
        return NodeError(node,
                         absl::StrCat("the output extent of spatial dim ", d, " overflows int64"));
      }
      g.out.push_back(o);
    }
  }
  return g;
}

namespace {

ShapesOr ConvTransposeShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  auto g = ConvTransposeResolve(node, *in[0], *in[1]);
  if (!g.ok()) return g.status();
  return std::vector<Shape>{g->out};
}

TensorsOr ConvTransposeReference(const Graph&, const Node& node,
                                 const std::vector<const Tensor*>& in) {
  auto g = ConvTransposeResolve(node, in[0]->shape, in[1]->shape);
  if (!g.ok()) return g.status();
  const Tensor* bias = in.size() > 2 ? in[2] : nullptr;
  return One(
      kernels::ConvTransposeRef(*in[0], *in[1], bias, g->p, node.GetInt("group", 1), g->out));
}

double ConvTransposeFlops(const Node&, const std::vector<const Shape*>& in) {
  return 2.0 * kernels::NumElements(*in[0]) * (kernels::NumElements(*in[1]) / (*in[1])[0]);
}

// --- Pooling ------------------------------------------------------------------------

absl::Status PoolValidate(const Graph&, const Node& node) {
  // MaxPool's optional Indices output (INT64) runs on the typed reference.
  if (absl::Status s = CheckArity(node, 1, 1, 1, node.op_type == "MaxPool" ? 2 : 1); !s.ok()) {
    return s;
  }
  const bool global = node.op_type.rfind("Global", 0) == 0;
  if (!global && !node.HasAttribute("kernel_shape")) {
    return NodeError(node, "kernel_shape is required");
  }
  // AveragePool's dilations (opset 19) with ceil_mode and count_include_pad:
  // the divisor ONNX defines for a window that ceil_mode lets run past the
  // padding is not the one the kernels use (libonnx-testdata 1.17's
  // test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True):
  // refused, not answered wrong.
  if (node.op_type == "AveragePool" && node.GetInt("ceil_mode", 0) != 0 &&
      node.GetInt("count_include_pad", 0) != 0) {
    for (int64_t d : node.GetInts("dilations", {})) {
      if (d != 1) {
        return NodeUnsupported(node, "dilations with ceil_mode and count_include_pad");
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<kernels::WindowParams> PoolWindow(const Node& node, const Shape& x) {
  if (node.op_type.rfind("Global", 0) == 0) {
    if (x.size() < 3 || x.size() > 5) {
      return NodeUnsupported(node, "supports 1-3 spatial dims");
    }
    kernels::WindowParams p;
    const size_t spatial = x.size() - 2;
    p.kernel.assign(x.begin() + 2, x.end());
    p.strides.assign(spatial, 1);
    p.dilations.assign(spatial, 1);
    p.pads_begin.assign(spatial, 0);
    p.pads_end.assign(spatial, 0);
    return p;
  }
  return ResolveWindow(node, x, node.GetInts("kernel_shape", {}));
}

ShapesOr PoolShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  auto p = PoolWindow(node, *in[0]);
  if (!p.ok()) return p.status();
  Shape out = {(*in[0])[0], (*in[0])[1]};
  for (int64_t o : WindowOutput(*in[0], *p, node.GetInt("ceil_mode", 0) != 0)) out.push_back(o);
  return std::vector<Shape>(std::max<size_t>(node.outputs.size(), 1), out);
}

TensorsOr PoolReference(const Graph& graph, const Node& node,
                        const std::vector<const Tensor*>& in) {
  auto p = PoolWindow(node, in[0]->shape);
  if (!p.ok()) return p.status();
  auto shapes = PoolShapes(graph, node, {&in[0]->shape});
  if (!shapes.ok()) return shapes.status();
  const bool is_max = node.op_type == "MaxPool" || node.op_type == "GlobalMaxPool";
  return One(kernels::PoolRef(is_max ? kernels::PoolKind::kMax : kernels::PoolKind::kAverage,
                              *in[0], *p, node.GetInt("count_include_pad", 0) != 0, (*shapes)[0]));
}

// --- BatchNormalization ---------------------------------------------------------------

// training_mode=1 (opset 14+): normalise with the batch's own mean and
// (biased) variance; the optional outputs 1 and 2 are the running mean and
// variance updated with `momentum`.
bool BatchNormTraining(const Node& node) { return node.GetInt("training_mode", 0) != 0; }

absl::Status BatchNormValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 5, 5, 1, 3); !s.ok()) return s;
  if (node.outputs.size() > 1 && (graph.opset() < 14 || !BatchNormTraining(node))) {
    return NodeUnsupported(node, "outputs beyond Y need training_mode=1 (opset 14 and later)");
  }
  if (node.outputs.size() == 2) return NodeError(node, "running_mean without running_var");
  return absl::OkStatus();
}

ShapesOr BatchNormShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  const Shape& x = *in[0];
  if (x.size() < 2) return NodeError(node, "input must have rank >= 2");
  std::vector<Shape> out{x};
  for (size_t j = 1; j < node.outputs.size(); ++j) out.push_back({x[1]});
  return out;
}

TensorsOr BatchNormReference(const Graph&, const Node& node, const std::vector<const Tensor*>& in) {
  for (const Tensor* t : in) {
    if (t == nullptr) return NodeError(node, "all five inputs are required");
  }
  const float epsilon = node.GetFloat("epsilon", 1e-5f);
  if (!BatchNormTraining(node)) {
    return One(kernels::BatchNormRef(*in[0], *in[1], *in[2], *in[3], *in[4], epsilon));
  }
  const Tensor& x = *in[0];
  if (x.rank() < 2) return NodeError(node, "input must have rank >= 2");
  const int64_t n = x.shape[0], c = x.shape[1], inner = x.size() / std::max<int64_t>(n * c, 1);
  for (int i = 1; i < 5; ++i) {
    if (in[i]->size() != c)
      return NodeError(node, absl::StrCat("input ", i, " needs ", c, " values"));
  }
  // The batch's statistics per channel, in double.
  Tensor mean({c}), var({c});
  const double count = static_cast<double>(n * inner);
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0;
    for (int64_t b = 0; b < n; ++b) {
      const float* p = x.data.data() + (b * c + ch) * inner;
      for (int64_t i = 0; i < inner; ++i) sum += p[i];
    }
    const double m = count > 0 ? sum / count : 0;
    double sq = 0;
    for (int64_t b = 0; b < n; ++b) {
      const float* p = x.data.data() + (b * c + ch) * inner;
      for (int64_t i = 0; i < inner; ++i) sq += (p[i] - m) * (p[i] - m);
    }
    mean.data[ch] = static_cast<float>(m);
    var.data[ch] = static_cast<float>(count > 0 ? sq / count : 0);
  }
  auto y = kernels::BatchNormRef(x, *in[1], *in[2], mean, var, epsilon);
  if (!y.ok()) return y.status();
  std::vector<Tensor> out{*std::move(y)};
  if (node.outputs.size() == 3) {
    const double momentum = node.GetFloat("momentum", 0.9f);
    Tensor running_mean({c}), running_var({c});
    for (int64_t ch = 0; ch < c; ++ch) {
      running_mean.data[ch] =
          static_cast<float>(in[3]->data[ch] * momentum + mean.data[ch] * (1 - momentum));
      running_var.data[ch] =
          static_cast<float>(in[4]->data[ch] * momentum + var.data[ch] * (1 - momentum));
    }
    out.push_back(std::move(running_mean));
    out.push_back(std::move(running_var));
  }
  return out;
}

}  // namespace

void AddNnOps(std::vector<OpSchema>& table) {
  table.push_back({"Conv", ConvValidate, ConvShapes, ConvReference, ConvFlops});
  table.push_back({"ConvTranspose", ConvValidate, ConvTransposeShapes, ConvTransposeReference,
                   ConvTransposeFlops});
  for (absl::string_view op : {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}) {
    table.push_back({op, PoolValidate, PoolShapes, PoolReference, NoFlops});
  }
  table.push_back(
      {"BatchNormalization", BatchNormValidate, BatchNormShapes, BatchNormReference, NoFlops});
}

}  // namespace numaserve::engine::ops
