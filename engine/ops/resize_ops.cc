// Op table rows for Resize and Upsample. A node's attributes and constant
// roi/scales/sizes are resolved against its input shape into the scalar
// kernel's parameters and the output shape: the interpolation mode and
// coordinate mapping, antialias (opset 18), the axes that roi, scales and
// sizes refer to (opset 18) and keep_aspect_ratio_policy (opset 18).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"
#include "kernels/ref/layout_ref.h"
#include "kernels/shape_ops.h"

namespace numaserve::engine::ops {
namespace {

struct ResizeSpec {
  kernels::ResizeParams params;
  Shape out;
};

// Upsample, and Resize before opset 11: scales are input 1, there is no roi
// or sizes, and coordinates map as asymmetric with floor.
bool OldForm(const Graph& graph, const Node& node) {
  return node.op_type == "Upsample" || graph.opset() < 11;
}

// The interpolation: mode, antialias, the cubic parameters and how output
// coordinates map to input ones.
absl::Status ReadInterpolation(const Graph& graph, const Node& node, kernels::ResizeParams& p) {
  p.mode = node.GetString("mode", "nearest");
  if (p.mode != "nearest" && p.mode != "linear" && p.mode != "cubic") {
    return NodeUnsupported(node, absl::StrCat("mode '", p.mode, "' is not supported"));
  }
  const int64_t antialias = node.GetInt("antialias", 0);
  if (antialias != 0 && antialias != 1) {
    return NodeError(node, absl::StrCat("antialias must be 0 or 1, not ", antialias));
  }
  // Nearest has no filter to stretch: it is the same with antialias.
  p.antialias = antialias == 1 && p.mode != "nearest";
  p.cubic_coeff_a = node.GetFloat("cubic_coeff_a", -0.75f);
  p.exclude_outside = node.GetInt("exclude_outside", 0) != 0;
  if (OldForm(graph, node)) {
    p.coordinate_transformation_mode = "asymmetric";
    p.nearest_mode = "floor";
  } else {
    p.coordinate_transformation_mode =
        node.GetString("coordinate_transformation_mode", "half_pixel");
    p.nearest_mode = node.GetString("nearest_mode", "round_prefer_floor");
  }
  const std::string& ctm = p.coordinate_transformation_mode;
  if (ctm != "half_pixel" && ctm != "asymmetric" && ctm != "align_corners" &&
      ctm != "pytorch_half_pixel" && ctm != "tf_half_pixel_for_nn" && ctm != "tf_crop_and_resize" &&
      ctm != "half_pixel_symmetric") {
    return NodeUnsupported(node, absl::StrCat("coordinate_transformation_mode '", ctm, "'"));
  }
  return absl::OkStatus();
}

// The dims that roi, scales and sizes refer to, in their order: the axes
// attribute (negative counts from the back, each dim at most once), or
// every dim where it is absent or empty.
absl::StatusOr<std::vector<int64_t>> ResizeAxes(const Node& node, size_t rank) {
  std::vector<int64_t> axes = node.GetInts("axes", {});
  if (axes.empty()) {
    axes.resize(rank);
    std::iota(axes.begin(), axes.end(), 0);
    return axes;
  }
  std::vector<bool> seen(rank, false);
  for (int64_t& axis : axes) {
    auto n = kernels::NormalizeAxis(axis, static_cast<int64_t>(rank));
    if (!n.ok()) return NodeError(node, absl::StrCat("axes: ", n.status().message()));
    if (seen[*n]) return NodeError(node, absl::StrCat("axes lists dim ", *n, " twice"));
    seen[*n] = true;
    axis = *n;
  }
  return axes;
}

// "3 values for 2 axes", or for every dim where there is no axes attribute.
std::string CountMismatch(absl::string_view what, size_t given, const Node& node, size_t axes) {
  return node.HasAttribute("axes")
             ? absl::StrCat(what, " has ", given, " values for the ", axes, " axes")
             : absl::StrCat(what, " has ", given, " values; the input has ", axes, " dims");
}

// tf_crop_and_resize: the constant roi (starts, then ends, for the axes),
// spread over every dim (0 to 1 where a dim is not among the axes).
absl::Status ReadRoi(const Graph& graph, const Node& node, size_t rank,
                     const std::vector<int64_t>& axes, kernels::ResizeParams& p) {
  auto roi = ConstFloats(graph, node, 1, "roi");
  if (!roi.ok()) return roi.status();
  const auto& given = *roi;
  const size_t n = axes.size();
  if (!given.has_value() || given->size() != 2 * n) {
    const std::string got = given.has_value() ? absl::StrCat(", got ", given->size()) : "";
    return NodeError(
        node, absl::StrCat("tf_crop_and_resize needs a constant roi of ", 2 * n, " values", got));
  }
  for (float v : *given) {
    if (!std::isfinite(v)) return NodeError(node, absl::StrCat("roi holds ", v));
  }
  p.roi.assign(2 * rank, 0.0f);
  std::fill(p.roi.begin() + static_cast<std::ptrdiff_t>(rank), p.roi.end(), 1.0f);
  for (size_t i = 0; i < n; ++i) {
    p.roi[axes[i]] = (*given)[i];
    p.roi[rank + axes[i]] = (*given)[n + i];
  }
  p.extrapolation_value = node.GetFloat("extrapolation_value", 0.0f);
  return absl::OkStatus();
}

// Output dims floor(in * scale) on the axes; the other dims are kept.
absl::Status OutFromScales(const Node& node, const Shape& x, const std::vector<int64_t>& axes,
                           const std::vector<float>& scales, ResizeSpec& spec) {
  if (scales.empty() && !axes.empty()) return NodeError(node, "needs constant scales or sizes");
  if (scales.size() != axes.size()) {
    return NodeError(node, CountMismatch("scales", scales.size(), node, axes.size()));
  }
  spec.params.scales.assign(x.size(), 1.0f);
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t d = axes[i];
    // Checked before the conversion: a huge, negative, infinite or NaN
    // scale is an error, not an undefined cast.
    const double extent = std::floor(static_cast<double>(x[d]) * static_cast<double>(scales[i]));
    if (!(scales[i] > 0.0f) || !(extent <= static_cast<double>(kernels::kMaxTensorElements))) {
      return NodeError(
          node, absl::StrCat("scales[", i, "] = ", scales[i], " on dim ", d, " of ",
                             kernels::ShapeToString(x), " is not positive or gives more than ",
                             kernels::kMaxTensorElements, " elements"));
    }
    spec.params.scales[d] = scales[i];
    spec.out[d] = static_cast<int64_t>(extent);
  }
  return absl::OkStatus();
}

// keep_aspect_ratio_policy not_larger / not_smaller: one scale for every
// axis, the smallest / largest of sizes[i] / in, and output dims
// round(in * scale) with halves rounded up.
absl::Status KeepAspectRatio(const Node& node, const Shape& x, const std::vector<int64_t>& axes,
                             const std::vector<int64_t>& sizes, const std::string& policy,
                             ResizeSpec& spec) {
  const bool not_larger = policy == "not_larger";
  double scale = not_larger ? std::numeric_limits<double>::infinity() : 0.0;
  for (size_t i = 0; i < axes.size(); ++i) {
    if (x[axes[i]] == 0) {
      return NodeError(node, absl::StrCat("keep_aspect_ratio_policy '", policy,
                                          "' needs a non-empty input; dim ", axes[i], " of ",
                                          kernels::ShapeToString(x), " is 0"));
    }
    const double r = static_cast<double>(sizes[i]) / static_cast<double>(x[axes[i]]);
    scale = not_larger ? std::min(scale, r) : std::max(scale, r);
  }
  for (int64_t d : axes) {
    const double extent = std::floor(scale * static_cast<double>(x[d]) + 0.5);
    if (!(extent <= static_cast<double>(kernels::kMaxTensorElements))) {
      return NodeError(
          node, absl::StrCat("keep_aspect_ratio_policy '", policy, "': scale ", scale, " on dim ",
                             d, " of ", kernels::ShapeToString(x), " gives more than ",
                             kernels::kMaxTensorElements, " elements"));
    }
    spec.out[d] = static_cast<int64_t>(extent);
    spec.params.scales[d] = static_cast<float>(scale);
  }
  return absl::OkStatus();
}

// Output dims from sizes on the axes (as given, or adjusted by the keep
// aspect ratio policy); the other dims are kept.
absl::Status OutFromSizes(const Node& node, const Shape& x, const std::vector<int64_t>& axes,
                          const std::vector<int64_t>& sizes, const std::string& policy,
                          ResizeSpec& spec) {
  if (sizes.size() != axes.size()) {
    return NodeError(node, CountMismatch("sizes", sizes.size(), node, axes.size()));
  }
  if (absl::Status s = CheckShape(node, sizes, "sizes"); !s.ok()) return s;
  spec.params.scales.assign(x.size(), 1.0f);
  if (policy != "stretch") return KeepAspectRatio(node, x, axes, sizes, policy, spec);
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t d = axes[i];
    if (x[d] == 0 && sizes[i] != 0) {
      return NodeError(node, absl::StrCat("sizes[", i, "] = ", sizes[i], " for dim ", d, " of ",
                                          kernels::ShapeToString(x), ", which is empty"));
    }
    spec.out[d] = sizes[i];
    if (x[d] != 0) spec.params.scales[d] = static_cast<float>(sizes[i]) / static_cast<float>(x[d]);
  }
  return absl::OkStatus();
}

absl::StatusOr<ResizeSpec> ResizeSpecOf(const Graph& graph, const Node& node, const Shape& x) {
  ResizeSpec spec;
  kernels::ResizeParams& p = spec.params;
  if (absl::Status s = ReadInterpolation(graph, node, p); !s.ok()) return s;
  auto axes = ResizeAxes(node, x.size());
  if (!axes.ok()) return axes.status();
  const std::string policy = node.GetString("keep_aspect_ratio_policy", "stretch");
  if (policy != "stretch" && policy != "not_larger" && policy != "not_smaller") {
    return NodeError(node, absl::StrCat("keep_aspect_ratio_policy '", policy,
                                        "' is not stretch, not_larger or not_smaller"));
  }
  if (p.coordinate_transformation_mode == "tf_crop_and_resize") {
    if (absl::Status s = ReadRoi(graph, node, x.size(), *axes, p); !s.ok()) return s;
  }
  const bool old_form = OldForm(graph, node);
  std::vector<float> scales = node.GetFloats("scales", {});
  if (auto s = ConstFloats(graph, node, old_form ? 1 : 2, "scales"); !s.ok()) {
    return s.status();
  } else if (const auto& given_scales = *s; given_scales.has_value() && !given_scales->empty()) {
    scales = *given_scales;
  }
  auto sizes = ConstInts(graph, node, 3, "sizes");
  if (!sizes.ok()) return sizes.status();
  spec.out = x;
  const auto& given_sizes = *sizes;
  if (!old_form && given_sizes.has_value() && !given_sizes->empty()) {
    if (absl::Status s = OutFromSizes(node, x, *axes, *given_sizes, policy, spec); !s.ok()) {
      return s;
    }
  } else if (policy != "stretch") {
    return NodeError(
        node, absl::StrCat("keep_aspect_ratio_policy '", policy, "' needs sizes, not scales"));
  } else if (absl::Status s = OutFromScales(node, x, *axes, scales, spec); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckShape(node, spec.out, "the resized output"); !s.ok()) return s;
  return spec;
}

absl::Status ResizeValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 1, 4); !s.ok()) return s;
  for (size_t i = 1; i < node.inputs.size(); ++i) {
    if (HasInput(node, i) && !graph.IsConstant(node.inputs[i])) {
      return NodeUnsupported(node, "roi/scales/sizes must be constants");
    }
  }
  return absl::OkStatus();
}

ShapesOr ResizeShapes(const Graph& graph, const Node& node, const std::vector<const Shape*>& in) {
  auto spec = ResizeSpecOf(graph, node, *in[0]);
  if (!spec.ok()) return spec.status();
  return std::vector<Shape>{spec->out};
}

TensorsOr ResizeReference(const Graph& graph, const Node& node,
                          const std::vector<const Tensor*>& in) {
  auto spec = ResizeSpecOf(graph, node, in[0]->shape);
  if (!spec.ok()) return spec.status();
  auto y = kernels::ResizeRef(*in[0], spec->params, spec->out);
  if (!y.ok()) return NodeError(node, y.status().message());
  return One(*std::move(y));
}

}  // namespace

void AddResizeOps(std::vector<OpSchema>& table) {
  table.push_back({"Resize", ResizeValidate, ResizeShapes, ResizeReference, NoFlops});
  table.push_back({"Upsample", ResizeValidate, ResizeShapes, ResizeReference, NoFlops});
}

}  // namespace numaserve::engine::ops
