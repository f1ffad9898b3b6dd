#include "kernels/ref/layout_ref.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/ref/elementwise_ref.h"
#include "kernels/shape_ops.h"

namespace numaserve::kernels {
namespace {

// Calls fn(flat_out, index) for every element of `shape` in row-major order.
template <typename Fn>
void ForEachIndex(const Shape& shape, Fn&& fn) {
  const int64_t count = NumElements(shape);
  std::vector<int64_t> index(shape.size(), 0);
  for (int64_t i = 0; i < count; ++i) {
    fn(i, index);
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace

Tensor TransposeRef(const Tensor& x, const std::vector<int64_t>& perm) {
  Shape out_shape(perm.size());
  for (size_t d = 0; d < perm.size(); ++d) out_shape[d] = x.shape[perm[d]];
  const std::vector<int64_t> in_strides = RowMajorStrides(x.shape);
  Tensor y(out_shape);
  ForEachIndex(out_shape, [&](int64_t i, const std::vector<int64_t>& idx) {
    int64_t off = 0;
    for (size_t d = 0; d < perm.size(); ++d) off += idx[d] * in_strides[perm[d]];
    y.data[i] = x.data[off];
  });
  return y;
}

Tensor ConcatRef(const std::vector<const Tensor*>& inputs, int64_t axis) {
  Shape out_shape = inputs[0]->shape;
  out_shape[axis] = 0;
  for (const Tensor* t : inputs) out_shape[axis] += t->shape[axis];
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= out_shape[d];
  for (size_t d = axis + 1; d < out_shape.size(); ++d) inner *= out_shape[d];
  Tensor y(out_shape);
  // No elements: nothing to copy (and `outer` alone may be huge).
  if (y.data.empty()) return y;
  float* dst = y.data.data();
  for (int64_t o = 0; o < outer; ++o) {
    for (const Tensor* t : inputs) {
      const int64_t chunk = t->shape[axis] * inner;
      std::copy_n(t->data.data() + o * chunk, chunk, dst);
      dst += chunk;
    }
  }
  return y;
}

std::vector<Tensor> SplitRef(const Tensor& x, int64_t axis, const std::vector<int64_t>& sizes) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.shape[d];
  for (size_t d = axis + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
  std::vector<Tensor> out;
  int64_t begin = 0;
  for (int64_t size : sizes) {
    Shape s = x.shape;
    s[axis] = size;
    Tensor t(s);
    for (int64_t o = 0; o < outer && size * inner > 0; ++o) {
      std::copy_n(x.data.data() + (o * x.shape[axis] + begin) * inner, size * inner,
                  t.data.data() + o * size * inner);
    }
    begin += size;
    out.push_back(std::move(t));
  }
  return out;
}

Tensor StridedSliceRef(const Tensor& x, const std::vector<int64_t>& starts,
                       const std::vector<int64_t>& steps, const Shape& out_shape) {
  const std::vector<int64_t> in_strides = RowMajorStrides(x.shape);
  Tensor y(out_shape);
  ForEachIndex(out_shape, [&](int64_t i, const std::vector<int64_t>& idx) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += (starts[d] + idx[d] * steps[d]) * in_strides[d];
    y.data[i] = x.data[off];
  });
  return y;
}

Tensor GatherRef(const Tensor& x, int64_t axis, const std::vector<int64_t>& indices,
                 const Shape& indices_shape) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.shape[d];
  for (size_t d = axis + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
  Shape out_shape(x.shape.begin(), x.shape.begin() + axis);
  out_shape.insert(out_shape.end(), indices_shape.begin(), indices_shape.end());
  out_shape.insert(out_shape.end(), x.shape.begin() + axis + 1, x.shape.end());
  Tensor y(out_shape);
  // No elements: nothing to copy (and `outer` alone may be huge).
  if (y.data.empty()) return y;
  float* dst = y.data.data();
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t index : indices) {
      std::copy_n(x.data.data() + (o * x.shape[axis] + index) * inner, inner, dst);
      dst += inner;
    }
  }
  return y;
}

absl::StatusOr<Tensor> PadRef(const Tensor& x, const std::vector<int64_t>& pads, PadMode mode,
                              float value) {
  const size_t rank = x.shape.size();
  Shape out_shape(rank);
  for (size_t d = 0; d < rank; ++d) {
    out_shape[d] = x.shape[d] + pads[d] + pads[rank + d];
    if (out_shape[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("Pad makes dim ", d, " negative"));
    }
    if (mode != PadMode::kConstant && x.shape[d] == 0 && out_shape[d] > 0) {
      return absl::InvalidArgumentError("Pad: reflect/edge need non-empty dims");
    }
  }
  const std::vector<int64_t> in_strides = RowMajorStrides(x.shape);
  Tensor y(out_shape);
  ForEachIndex(out_shape, [&](int64_t i, const std::vector<int64_t>& idx) {
    int64_t off = 0;
    for (size_t d = 0; d < rank; ++d) {
      int64_t s = idx[d] - pads[d];
      const int64_t n = x.shape[d];
      if (s < 0 || s >= n) {
        if (mode == PadMode::kConstant) {
          y.data[i] = value;
          return;
        }
        if (mode == PadMode::kEdge) {
          s = std::clamp<int64_t>(s, 0, n - 1);
        } else if (n == 1) {
          s = 0;
        } else {
          const int64_t period = 2 * (n - 1);
          s = ((s % period) + period) % period;
          if (s >= n) s = period - s;
        }
      }
      off += s * in_strides[d];
    }
    y.data[i] = x.data[off];
  });
  return y;
}

Tensor ExpandRef(const Tensor& x, const Shape& out_shape) {
  Tensor y(out_shape);
  const std::vector<int64_t> offsets = BroadcastOffsets(x.shape, out_shape);
  for (int64_t i = 0; i < y.size(); ++i) y.data[i] = x.data[offsets[i]];
  return y;
}

Tensor TileRef(const Tensor& x, const std::vector<int64_t>& repeats) {
  Shape out_shape = x.shape;
  for (size_t d = 0; d < out_shape.size(); ++d) out_shape[d] *= repeats[d];
  const std::vector<int64_t> in_strides = RowMajorStrides(x.shape);
  Tensor y(out_shape);
  ForEachIndex(out_shape, [&](int64_t i, const std::vector<int64_t>& idx) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += (idx[d] % x.shape[d]) * in_strides[d];
    y.data[i] = x.data[off];
  });
  return y;
}

namespace {

// Input coordinate for output coordinate `o` along a dim.
double SourceCoordinate(const ResizeParams& p, size_t dim, int64_t o, int64_t in_len,
                        int64_t out_len, float scale) {
  const std::string& m = p.coordinate_transformation_mode;
  if (m == "asymmetric") return o / static_cast<double>(scale);
  if (m == "tf_half_pixel_for_nn") return (o + 0.5) / scale;
  if (m == "tf_crop_and_resize") {
    const size_t rank = p.roi.size() / 2;
    const double start = p.roi[dim], end = p.roi[rank + dim];
    return out_len > 1 ? start * (in_len - 1) + o * (end - start) * (in_len - 1) / (out_len - 1)
                       : 0.5 * (start + end) * (in_len - 1);
  }
  if (m == "align_corners") {
    // The resized length is in_len * scale, not rounded (as ONNX defines it).
    const double resized = static_cast<double>(in_len) * scale;
    return out_len == 1 || resized <= 1.0 ? 0.0
                                          : o * static_cast<double>(in_len - 1) / (resized - 1);
  }
  if (m == "pytorch_half_pixel") {
    return out_len > 1 ? (o + 0.5) / scale - 0.5 : 0.0;
  }
  if (m == "half_pixel_symmetric") {
    // Opset 19: half_pixel, shifted so that the rounding of the output's
    // length (in_len * scale) is shared by both ends.
    const double resized = static_cast<double>(in_len) * scale;
    const double adjustment = static_cast<double>(out_len) / resized;
    const double offset = in_len / 2.0 * (1.0 - adjustment);
    return offset + (o + 0.5) / scale - 0.5;
  }
  return (o + 0.5) / scale - 0.5;  // half_pixel
}

int64_t NearestIndex(const std::string& mode, double x) {
  if (mode == "floor") return static_cast<int64_t>(std::floor(x));
  if (mode == "ceil") return static_cast<int64_t>(std::ceil(x));
  const double f = std::floor(x);
  if (x - f == 0.5) {
    return mode == "round_prefer_ceil" ? static_cast<int64_t>(f) + 1 : static_cast<int64_t>(f);
  }
  return static_cast<int64_t>(std::round(x));
}

// Per dim and output coordinate: the source indices and their weights.
struct Taps {
  std::vector<int64_t> index;
  std::vector<double> weight;
};

// Cubic convolution with coefficient a at distance s (Keys, 1981).
double CubicWeight(double a, double s) {
  s = std::fabs(s);
  if (s <= 1) return ((a + 2) * s - (a + 3)) * s * s + 1;
  if (s < 2) return ((a * s - 5 * a) * s + 8 * a) * s - 4 * a;
  return 0.0;
}

Taps LinearTaps(double c, int64_t in_len) {
  const double cc = std::clamp(c, 0.0, static_cast<double>(in_len - 1));
  const int64_t i0 = static_cast<int64_t>(std::floor(cc));
  return {.index = {i0, std::min(i0 + 1, in_len - 1)}, .weight = {1.0 - (cc - i0), cc - i0}};
}

// Cubic convolution over 4 taps; taps outside the input repeat the edge, or
// are dropped and the rest renormalised with exclude_outside.
Taps CubicTaps(const ResizeParams& p, double c, int64_t in_len) {
  const int64_t i0 = static_cast<int64_t>(std::floor(c));
  const double f = c - i0;
  Taps t;
  double total = 0;
  for (int64_t k = -1; k <= 2; ++k) {
    const int64_t src = i0 + k;
    double w = CubicWeight(p.cubic_coeff_a, k - f);
    if (p.exclude_outside && (src < 0 || src >= in_len)) w = 0;
    t.index.push_back(std::clamp<int64_t>(src, 0, in_len - 1));
    t.weight.push_back(w);
    total += w;
  }
  if (p.exclude_outside && total != 0) {
    for (double& w : t.weight) w /= total;
  }
  return t;
}

// The antialiased linear or cubic filter when downsampling (scale < 1): the
// filter stretched by 1 / scale, so every input index within support /
// scale of c contributes, weights normalised to sum to 1. The window is
// indexed from i0 = ceil(c) - 1 (c - i0 in (0, 1]) and runs from i0 + first
// to i0 + 1 - first; its outermost taps weigh 0 where support / scale is
// whole. Taps outside the input repeat the edge, or weigh 0 with
// exclude_outside.
Taps WideTaps(const ResizeParams& p, double c, double scale, int64_t in_len) {
  const bool cubic = p.mode == "cubic";
  const int64_t i0 = static_cast<int64_t>(std::ceil(c)) - 1;
  const double frac = c - static_cast<double>(i0);
  const int64_t first = static_cast<int64_t>(std::floor(-(cubic ? 2.0 : 1.0) / scale)) + 1;
  Taps t;
  double total = 0;
  for (int64_t j = first; j <= 1 - first; ++j) {
    const double s = scale * (static_cast<double>(j) - frac);
    double w = cubic ? CubicWeight(p.cubic_coeff_a, s) : std::max(0.0, 1.0 - std::fabs(s));
    const int64_t src = i0 + j;
    if (p.exclude_outside && (src < 0 || src >= in_len)) w = 0;
    t.index.push_back(std::clamp<int64_t>(src, 0, in_len - 1));
    t.weight.push_back(w);
    total += w;
  }
  if (total != 0) {
    for (double& w : t.weight) w /= total;
  }
  return t;
}

// The taps of every output coordinate along dim d (none where
// tf_crop_and_resize falls outside the input).
absl::StatusOr<std::vector<Taps>> DimTaps(const ResizeParams& p, size_t d, int64_t in_len,
                                          int64_t out_len, bool crop) {
  const double scale = p.scales[d];
  const bool wide = p.antialias && p.mode != "nearest" && scale < 1.0;
  // The stretched filter reaches (1 or 2) / scale input indices either side
  // of c. A scale that gives a non-empty output keeps that within 4 times
  // the input's length; one far below is refused, not a window of billions.
  const double reach = (p.mode == "cubic" ? 2.0 : 1.0) / scale;
  if (wide && !(reach <= 8.0 * static_cast<double>(in_len + 1))) {
    return absl::InvalidArgumentError(absl::StrCat("Resize antialias: scale ", scale, " on dim ", d,
                                                   " is too small for a length of ", in_len));
  }
  std::vector<Taps> taps;
  taps.reserve(out_len);
  for (int64_t o = 0; o < out_len; ++o) {
    const double c = SourceCoordinate(p, d, o, in_len, out_len, p.scales[d]);
    if (crop && !(c >= 0 && c <= static_cast<double>(in_len - 1))) {
      taps.emplace_back();  // outside the input: extrapolation_value
    } else if (p.mode == "nearest") {
      taps.push_back(
          {.index = {std::clamp<int64_t>(NearestIndex(p.nearest_mode, c), 0, in_len - 1)},
           .weight = {1.0}});
    } else if (wide) {
      taps.push_back(WideTaps(p, c, scale, in_len));
    } else if (p.mode == "linear") {
      taps.push_back(LinearTaps(c, in_len));
    } else {
      taps.push_back(CubicTaps(p, c, in_len));
    }
  }
  return taps;
}

// True where the taps copy the dim unchanged (output o reads input o alone).
bool IsIdentity(const std::vector<Taps>& taps, int64_t in_len) {
  if (static_cast<int64_t>(taps.size()) != in_len) return false;
  for (size_t o = 0; o < taps.size(); ++o) {
    const Taps& t = taps[o];
    if (t.index.empty()) return false;
    for (size_t k = 0; k < t.index.size(); ++k) {
      const double want = t.index[k] == static_cast<int64_t>(o) ? 1.0 : 0.0;
      if (t.weight[k] != want) return false;
    }
  }
  return true;
}

// Resamples dim d of `src` (of shape `shape`) with one set of taps per
// output coordinate into `dst`; shape[d] becomes the output length.
void ResizeDim(const std::vector<float>& src, Shape& shape, size_t d, const std::vector<Taps>& taps,
               std::vector<float>& dst) {
  int64_t outer = 1, inner = 1;
  for (size_t k = 0; k < d; ++k) outer *= shape[k];
  for (size_t k = d + 1; k < shape.size(); ++k) inner *= shape[k];
  const int64_t in_len = shape[d], out_len = static_cast<int64_t>(taps.size());
  dst.assign(outer * out_len * inner, 0.0f);
  // Sums in double, a block of the inner elements at a time.
  constexpr int64_t kBlock = 1024;
  std::array<double, kBlock> acc;
  for (int64_t a = 0; a < outer; ++a) {
    const float* slab = src.data() + a * in_len * inner;
    for (int64_t o = 0; o < out_len; ++o) {
      const Taps& t = taps[o];
      float* out_row = dst.data() + (a * out_len + o) * inner;
      for (int64_t i0 = 0; i0 < inner; i0 += kBlock) {
        const int64_t n = std::min(kBlock, inner - i0);
        std::fill_n(acc.begin(), n, 0.0);
        for (size_t k = 0; k < t.index.size(); ++k) {
          if (t.weight[k] == 0.0) continue;  // also keeps an infinity out of 0 * inf
          const float* row = slab + t.index[k] * inner + i0;
          for (int64_t i = 0; i < n; ++i) acc[i] += t.weight[k] * row[i];
        }
        for (int64_t i = 0; i < n; ++i) out_row[i0 + i] = static_cast<float>(acc[i]);
      }
    }
  }
  shape[d] = out_len;
}

// tf_crop_and_resize: every output point whose source lies outside the
// input along some dim is the extrapolation value.
void FillOutside(const std::vector<std::vector<Taps>>& taps, const Shape& out_shape, float value,
                 std::vector<float>& y) {
  for (size_t d = 0; d < out_shape.size(); ++d) {
    int64_t outer = 1, inner = 1;
    for (size_t k = 0; k < d; ++k) outer *= out_shape[k];
    for (size_t k = d + 1; k < out_shape.size(); ++k) inner *= out_shape[k];
    for (int64_t o = 0; o < out_shape[d]; ++o) {
      if (!taps[d][o].index.empty()) continue;
      for (int64_t a = 0; a < outer; ++a) {
        std::fill_n(y.begin() + (a * out_shape[d] + o) * inner, inner, value);
      }
    }
  }
}

}  // namespace

// Resize is separable: the output is the input filtered along one dim at a
// time. The dims that shrink go first, so no intermediate holds more
// elements than the larger of the input and the output, and the work is a
// few passes over those rather than the product of every dim's taps per
// output point (which an antialiased downsample makes large).
absl::StatusOr<Tensor> ResizeRef(const Tensor& x, const ResizeParams& p, const Shape& out_shape) {
  const size_t rank = x.shape.size();
  if (p.mode != "nearest" && p.mode != "linear" && p.mode != "cubic") {
    return absl::UnimplementedError(absl::StrCat("Resize mode '", p.mode, "' is not supported"));
  }
  if (out_shape.size() != rank || p.scales.size() != rank) {
    return absl::InvalidArgumentError(absl::StrCat("Resize of a rank-", rank, " input needs ", rank,
                                                   " output dims and scales, got ",
                                                   out_shape.size(), " and ", p.scales.size()));
  }
  const bool crop = p.coordinate_transformation_mode == "tf_crop_and_resize";
  if (crop && p.roi.size() != 2 * rank) {
    return absl::InvalidArgumentError(absl::StrCat("Resize tf_crop_and_resize needs ", 2 * rank,
                                                   " roi values, got ", p.roi.size()));
  }
  // An empty output needs no taps: without this, one long dim beside a zero
  // one (scales 2^21 and 1e-12) would build millions of taps for nothing.
  if (NumElements(out_shape) == 0) return Tensor(out_shape);
  if (x.data.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("Resize of the empty ", ShapeToString(x.shape),
                                                   " to ", ShapeToString(out_shape)));
  }
  for (size_t d = 0; d < rank; ++d) {
    if (!(p.scales[d] > 0.0f && std::isfinite(p.scales[d]))) {
      return absl::InvalidArgumentError(
          absl::StrCat("Resize scale ", p.scales[d], " on dim ", d, " is not positive and finite"));
    }
  }
  std::vector<std::vector<Taps>> taps(rank);
  for (size_t d = 0; d < rank; ++d) {
    auto t = DimTaps(p, d, x.shape[d], out_shape[d], crop);
    if (!t.ok()) return t.status();
    taps[d] = *std::move(t);
  }
  std::vector<size_t> order;
  for (size_t d = 0; d < rank; ++d) {
    if (out_shape[d] < x.shape[d]) order.push_back(d);
  }
  for (size_t d = 0; d < rank; ++d) {
    if (out_shape[d] >= x.shape[d]) order.push_back(d);
  }
  Shape shape = x.shape;
  const std::vector<float>* src = &x.data;
  std::array<std::vector<float>, 2> buffers;
  size_t next = 0;
  for (size_t d : order) {
    if (IsIdentity(taps[d], shape[d])) continue;
    ResizeDim(*src, shape, d, taps[d], buffers[next]);
    src = &buffers[next];
    next ^= 1;
  }
  Tensor y;
  y.shape = out_shape;
  if (src == &x.data) {
    y.data = x.data;  // every dim kept as it is
  } else {
    y.data = std::move(buffers[next ^ 1]);
  }
  if (crop) FillOutside(taps, out_shape, p.extrapolation_value, y.data);
  return y;
}

absl::StatusOr<Shape> MatMulShape(const Shape& a, const Shape& b) {
  if (a.empty() || b.empty()) return absl::InvalidArgumentError("MatMul operands must be >= 1-D");
  Shape pa = a.size() == 1 ? Shape{1, a[0]} : a;
  Shape pb = b.size() == 1 ? Shape{b[0], 1} : b;
  if (pa.back() != pb[pb.size() - 2]) {
    return absl::InvalidArgumentError(
        absl::StrCat("MatMul inner dims differ: ", ShapeToString(a), " x ", ShapeToString(b)));
  }
  auto batch = BroadcastShapes(Shape(pa.begin(), pa.end() - 2), Shape(pb.begin(), pb.end() - 2));
  if (!batch.ok()) return batch.status();
  Shape out = *batch;
  if (a.size() > 1) out.push_back(pa[pa.size() - 2]);
  if (b.size() > 1) out.push_back(pb.back());
  return out;
}

absl::StatusOr<Tensor> BatchedMatMulRef(const Tensor& a, const Tensor& b) {
  auto out_shape = MatMulShape(a.shape, b.shape);
  if (!out_shape.ok()) return out_shape.status();
  const Shape pa = a.rank() == 1 ? Shape{1, a.shape[0]} : a.shape;
  const Shape pb = b.rank() == 1 ? Shape{b.shape[0], 1} : b.shape;
  const int64_t m = pa[pa.size() - 2], k = pa.back(), n = pb.back();
  const Shape ba(pa.begin(), pa.end() - 2), bb(pb.begin(), pb.end() - 2);
  const Shape batch = *BroadcastShapes(ba, bb);
  const std::vector<int64_t> oa = BroadcastOffsets(ba, batch), ob = BroadcastOffsets(bb, batch);
  Tensor y(*out_shape);
  for (size_t bi = 0; bi < oa.size(); ++bi) {
    const float* ap = a.data.data() + oa[bi] * m * k;
    const float* bp = b.data.data() + ob[bi] * k * n;
    float* yp = y.data.data() + bi * m * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (int64_t l = 0; l < k; ++l) acc += static_cast<double>(ap[i * k + l]) * bp[l * n + j];
        yp[i * n + j] = static_cast<float>(acc);
      }
    }
  }
  return y;
}

}  // namespace numaserve::kernels
