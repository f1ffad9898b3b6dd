// Op table row for RoiAlign (opsets 10 and 16), as detection heads
// (Mask R-CNN, Faster R-CNN) export it: X [N, C, H, W], rois [R, 4]
// (x1, y1, x2, y2 in X's coordinates before spatial_scale) and
// batch_indices [R] (INT64) give Y [R, C, output_height, output_width];
// R follows the rois at run time. Modes avg and max, sampling_ratio 0
// (adaptive: ceil(roi extent / output extent) samples per bin along each
// axis), coordinate_transformation_mode half_pixel (opset 16's default)
// and output_half_pixel (opset 10's behaviour). Each sample is a bilinear
// interpolation of its four neighbours; samples more than one pixel
// outside X count as 0. Max mode takes, per bin, the largest weighted
// corner of any sample, as ONNX Runtime does. FP32 only. A batch index
// out of range, non-finite roi coordinates or more samples than
// kMaxRoiWork are an INVALID_ARGUMENT naming the node for that run.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"
#include "engine/ops/typed_exec.h"
#include "engine/ops/typed_util.h"

namespace numaserve::engine::ops {
namespace {

// The most bilinear samples one node may take in a run, over all rois and
// channels (each reads four values of X), and the most one bin may take
// (held at once): rois spanning far more pixels than X has, with adaptive
// sampling, are refused rather than left to run for minutes.
constexpr double kMaxRoiWork = 1e10;
constexpr double kMaxBinSamples = 1 << 20;

struct RoiParams {
  bool max_mode = false;
  bool half_pixel = true;
  int64_t out_h = 1, out_w = 1;
  int64_t sampling_ratio = 0;
  float spatial_scale = 1.0F;
};

absl::StatusOr<RoiParams> RoiParamsOf(const Graph& graph, const Node& node) {
  RoiParams p;
  const std::string mode = node.GetString("mode", "avg");
  if (mode != "avg" && mode != "max") {
    return NodeUnsupported(node, absl::StrCat("mode '", mode, "' (avg and max are supported)"));
  }
  p.max_mode = mode == "max";
  // Opset 10 has no such attribute and places samples as output_half_pixel.
  const std::string coordinates = node.GetString(
      "coordinate_transformation_mode", graph.opset() >= 16 ? "half_pixel" : "output_half_pixel");
  if (coordinates != "half_pixel" && coordinates != "output_half_pixel") {
    return NodeUnsupported(node,
                           absl::StrCat("coordinate_transformation_mode '", coordinates,
                                        "' (half_pixel and output_half_pixel are supported)"));
  }
  p.half_pixel = coordinates == "half_pixel";
  p.out_h = node.GetInt("output_height", 1);
  p.out_w = node.GetInt("output_width", 1);
  p.sampling_ratio = node.GetInt("sampling_ratio", 0);
  p.spatial_scale = node.GetFloat("spatial_scale", 1.0F);
  constexpr int64_t kMaxExtent = int64_t{1} << 16;
  if (p.out_h < 1 || p.out_w < 1 || p.out_h > kMaxExtent || p.out_w > kMaxExtent) {
    return NodeError(node, absl::StrCat("output_height and output_width must be in 1..", kMaxExtent,
                                        ", are ", p.out_h, " and ", p.out_w));
  }
  if (p.sampling_ratio < 0 || p.sampling_ratio > kMaxExtent) {
    return NodeError(
        node, absl::StrCat("sampling_ratio must be in 0..", kMaxExtent, ", is ", p.sampling_ratio));
  }
  if (!std::isfinite(p.spatial_scale)) return NodeError(node, "spatial_scale must be finite");
  return p;
}

absl::Status RoiAlignValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 3, 3); !s.ok()) return s;
  for (size_t i = 0; i < 3; ++i) {
    if (!HasInput(node, i)) return NodeError(node, absl::StrCat("input ", i, " is required"));
  }
  return RoiParamsOf(graph, node).status();
}

ShapesOr RoiAlignShapes(const Graph& graph, const Node& node, const std::vector<const Shape*>& in) {
  auto p = RoiParamsOf(graph, node);
  if (!p.ok()) return p.status();
  const Shape& x = *in[0];
  const Shape& rois = *in[1];
  const Shape& batch = *in[2];
  if (x.size() != 4) {
    return NodeError(node, absl::StrCat("X must be [N, C, H, W], is ", kernels::ShapeToString(x)));
  }
  if (rois.size() != 2 || rois[1] != 4 || batch.size() != 1 || batch[0] != rois[0]) {
    return NodeError(
        node, absl::StrCat("rois must be [R, 4] and batch_indices [R], are ",
                           kernels::ShapeToString(rois), " and ", kernels::ShapeToString(batch)));
  }
  Shape out = {rois[0], x[1], p->out_h, p->out_w};
  if (absl::Status s = CheckShape(node, out, "the output"); !s.ok()) return s;
  return std::vector<Shape>{out};
}

// Where one sample reads X and with what weights (all 0 outside X).
struct Sample {
  int64_t at[4] = {0, 0, 0, 0};
  float w[4] = {0, 0, 0, 0};
};

// One coordinate's low and high neighbours and the weight of the high one.
void Neighbours(float v, int64_t size, int64_t& low, int64_t& high, float& frac) {
  if (v <= 0) v = 0;
  low = static_cast<int64_t>(v);
  if (low >= size - 1) {
    low = high = size - 1;
    v = static_cast<float>(low);
  } else {
    high = low + 1;
  }
  frac = v - static_cast<float>(low);
}

Sample SampleAt(float y, float x, int64_t height, int64_t width) {
  Sample s;
  if (y < -1.0F || y > static_cast<float>(height) || x < -1.0F || x > static_cast<float>(width)) {
    return s;
  }
  int64_t y0 = 0, y1 = 0, x0 = 0, x1 = 0;
  float ly = 0, lx = 0;
  Neighbours(y, height, y0, y1, ly);
  Neighbours(x, width, x0, x1, lx);
  const float hy = 1.0F - ly, hx = 1.0F - lx;
  s.at[0] = y0 * width + x0;
  s.at[1] = y0 * width + x1;
  s.at[2] = y1 * width + x0;
  s.at[3] = y1 * width + x1;
  s.w[0] = hy * hx;
  s.w[1] = hy * lx;
  s.w[2] = ly * hx;
  s.w[3] = ly * lx;
  return s;
}

// Where one roi's bins lie and how many samples each takes per axis.
struct RoiGeometry {
  float start_h = 0, start_w = 0, bin_h = 0, bin_w = 0;
  int64_t grid_h = 0, grid_w = 0;
  int64_t per_bin = 1;  // what avg divides by
};

absl::StatusOr<RoiGeometry> GeometryOf(const Node& node, const RoiParams& p, const float* roi) {
  RoiGeometry g;
  const float offset = p.half_pixel ? 0.5F : 0.0F;
  g.start_w = roi[0] * p.spatial_scale - offset;
  g.start_h = roi[1] * p.spatial_scale - offset;
  float roi_w = roi[2] * p.spatial_scale - offset - g.start_w;
  float roi_h = roi[3] * p.spatial_scale - offset - g.start_h;
  if (!std::isfinite(g.start_w) || !std::isfinite(g.start_h) || !std::isfinite(roi_w) ||
      !std::isfinite(roi_h)) {
    return NodeError(node, "a roi's coordinates (times spatial_scale) are not finite");
  }
  if (!p.half_pixel) {
    roi_w = std::max(roi_w, 1.0F);
    roi_h = std::max(roi_h, 1.0F);
  }
  g.bin_h = roi_h / static_cast<float>(p.out_h);
  g.bin_w = roi_w / static_cast<float>(p.out_w);
  const double grid_h = p.sampling_ratio > 0 ? static_cast<double>(p.sampling_ratio)
                                             : std::ceil(static_cast<double>(g.bin_h));
  const double grid_w = p.sampling_ratio > 0 ? static_cast<double>(p.sampling_ratio)
                                             : std::ceil(static_cast<double>(g.bin_w));
  if (std::max(grid_h, 0.0) * std::max(grid_w, 0.0) > kMaxBinSamples) {
    return NodeError(node, absl::StrCat("a roi's bins take more than ", kMaxBinSamples,
                                        " samples each (a roi far larger than X?)"));
  }
  g.grid_h = static_cast<int64_t>(std::max(grid_h, 0.0));
  g.grid_w = static_cast<int64_t>(std::max(grid_w, 0.0));
  g.per_bin = std::max<int64_t>(g.grid_h * g.grid_w, 1);
  return g;
}

// Bin (ph, pw)'s samples, in order.
void BinSamples(const RoiGeometry& g, int64_t ph, int64_t pw, int64_t height, int64_t width,
                std::vector<Sample>& out) {
  out.clear();
  for (int64_t iy = 0; iy < g.grid_h; ++iy) {
    const float y = g.start_h + static_cast<float>(ph) * g.bin_h +
                    (static_cast<float>(iy) + 0.5F) * g.bin_h / static_cast<float>(g.grid_h);
    for (int64_t ix = 0; ix < g.grid_w; ++ix) {
      const float x = g.start_w + static_cast<float>(pw) * g.bin_w +
                      (static_cast<float>(ix) + 0.5F) * g.bin_w / static_cast<float>(g.grid_w);
      out.push_back(SampleAt(y, x, height, width));
    }
  }
}

// One bin of one channel plane.
float Pool(bool max_mode, int64_t per_bin, const std::vector<Sample>& samples, const float* plane) {
  float acc = 0;
  for (size_t k = 0; k < samples.size(); ++k) {
    const Sample& s = samples[k];
    if (max_mode) {
      const float v = std::max(std::max(s.w[0] * plane[s.at[0]], s.w[1] * plane[s.at[1]]),
                               std::max(s.w[2] * plane[s.at[2]], s.w[3] * plane[s.at[3]]));
      acc = k == 0 ? v : std::max(acc, v);
    } else {
      acc += s.w[0] * plane[s.at[0]] + s.w[1] * plane[s.at[1]] + s.w[2] * plane[s.at[2]] +
             s.w[3] * plane[s.at[3]];
    }
  }
  return max_mode ? acc : acc / static_cast<float>(per_bin);
}

// Checks what the run will cost before it starts: every batch index in
// range, every roi's geometry valid, the samples times channels within
// kMaxRoiWork.
absl::StatusOr<std::vector<RoiGeometry>> CheckRois(const Node& node, const RoiParams& p,
                                                   const TypedTensor& x, const TypedTensor& rois,
                                                   const TypedTensor& batch) {
  std::vector<RoiGeometry> out;
  double work = 0;
  for (int64_t r = 0; r < rois.shape[0]; ++r) {
    const int64_t b = batch.GetInt64(r);
    if (b < 0 || b >= x.shape[0]) {
      return NodeError(node, absl::StrCat("batch index ", b, " of roi ", r,
                                          " is out of range for X's batch of ", x.shape[0]));
    }
    auto g = GeometryOf(node, p, rois.data<float>() + r * 4);
    if (!g.ok()) return g.status();
    work += static_cast<double>(g->grid_h * g->grid_w) * static_cast<double>(p.out_h * p.out_w) *
            static_cast<double>(x.shape[1]);
    if (work > kMaxRoiWork) {
      return NodeError(node, absl::StrCat("the rois take more than ", kMaxRoiWork,
                                          " samples over all channels (rois far larger than X?)"));
    }
    out.push_back(*g);
  }
  return out;
}

TypedOr RoiAlignTyped(const Graph& graph, const Node& node, const TypedIn& in) {
  auto p = RoiParamsOf(graph, node);
  if (!p.ok()) return p.status();
  auto shapes = RoiAlignShapes(graph, node, {&in[0]->shape, &in[1]->shape, &in[2]->shape});
  if (!shapes.ok()) return shapes.status();
  const TypedTensor& x = *in[0];
  const TypedTensor& rois = *in[1];
  const TypedTensor& batch = *in[2];
  if (x.type != DataType::kFloat32 || rois.type != DataType::kFloat32) {
    return Refuse(node, x.type != DataType::kFloat32 ? x.type : rois.type, "X or rois");
  }
  auto geometry = CheckRois(node, *p, x, rois, batch);
  if (!geometry.ok()) return geometry.status();
  const int64_t c = x.shape[1], h = x.shape[2], w = x.shape[3];
  TypedTensor y(DataType::kFloat32, (*shapes)[0]);
  const int64_t bins = p->out_h * p->out_w;
  std::vector<Sample> samples;
  for (int64_t r = 0; r < rois.shape[0]; ++r) {
    const RoiGeometry& g = (*geometry)[r];
    const float* image = x.data<float>() + batch.GetInt64(r) * c * h * w;
    float* out = y.data<float>() + r * c * bins;
    for (int64_t ph = 0; ph < p->out_h; ++ph) {
      for (int64_t pw = 0; pw < p->out_w; ++pw) {
        BinSamples(g, ph, pw, h, w, samples);
        for (int64_t ch = 0; ch < c; ++ch) {
          out[ch * bins + ph * p->out_w + pw] =
              Pool(p->max_mode, g.per_bin, samples, image + ch * h * w);
        }
      }
    }
  }
  return OneT(std::move(y));
}

TensorsOr RoiAlignReference(const Graph& graph, const Node& node,
                            const std::vector<const Tensor*>& in) {
  return FloatThroughTyped(graph, node, in, RoiAlignTyped);
}

absl::Status RoiAlignAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  for (size_t i = 0; i < 2; ++i) {
    if (in[i] != DataType::kFloat32) return Refuse(node, in[i], i == 0 ? "X" : "rois");
  }
  if (in[2] != DataType::kInt64) return Refuse(node, in[2], "batch_indices (not INT64)");
  if (out[0] != DataType::kFloat32) return Refuse(node, out[0], "the output");
  return absl::OkStatus();
}

const TypedRow kRoiTypedRows[] = {{"RoiAlign", RoiAlignTyped, RoiAlignAccepts}};

}  // namespace

void AddRoiOps(std::vector<OpSchema>& table) {
  table.push_back({"RoiAlign", RoiAlignValidate, RoiAlignShapes, RoiAlignReference, NoFlops});
  SetTypedRows(table, kRoiTypedRows);
}

}  // namespace numaserve::engine::ops
