#include "kernels/ref/add_ref.h"

#include <algorithm>

#include "kernels/shape_ops.h"

namespace numaserve::kernels {
namespace {

// Strides of `shape` padded to `rank`, with 0 where a dim is broadcast.
std::vector<int64_t> BroadcastStrides(const Shape& shape, size_t rank) {
  Shape padded = PadShapeLeft(shape, rank);
  std::vector<int64_t> strides = RowMajorStrides(padded);
  for (size_t i = 0; i < rank; ++i) {
    if (padded[i] == 1) strides[i] = 0;
  }
  return strides;
}

// Calls fn(out_index, a_index, b_index) for every element of out_shape.
template <typename Fn>
void ForEachBroadcast(const Shape& a_shape, const Shape& b_shape, const Shape& out_shape, Fn fn) {
  const size_t rank = out_shape.size();
  const std::vector<int64_t> sa = BroadcastStrides(a_shape, rank);
  const std::vector<int64_t> sb = BroadcastStrides(b_shape, rank);
  const int64_t total = NumElements(out_shape);
  std::vector<int64_t> idx(rank, 0);
  int64_t ia = 0, ib = 0;
  for (int64_t o = 0; o < total; ++o) {
    fn(o, ia, ib);
    // Odometer increment over out_shape, keeping ia/ib in step.
    for (int64_t d = static_cast<int64_t>(rank) - 1; d >= 0; --d) {
      if (++idx[d] < out_shape[d]) {
        ia += sa[d];
        ib += sb[d];
        break;
      }
      ia -= sa[d] * (out_shape[d] - 1);
      ib -= sb[d] * (out_shape[d] - 1);
      idx[d] = 0;
    }
  }
}

}  // namespace

void AddBroadcast(const float* a, const Shape& a_shape, const float* b, const Shape& b_shape,
                  float* out, const Shape& out_shape) {
  ForEachBroadcast(a_shape, b_shape, out_shape,
                   [&](int64_t o, int64_t ia, int64_t ib) { out[o] = a[ia] + b[ib]; });
}

void BroadcastTo(const float* src, const Shape& src_shape, float* dst, const Shape& dst_shape) {
  ForEachBroadcast(src_shape, src_shape, dst_shape,
                   [&](int64_t o, int64_t ia, int64_t) { dst[o] = src[ia]; });
}

absl::StatusOr<Tensor> AddRef(const Tensor& a, const Tensor& b) {
  auto shape = BroadcastShapes(a.shape, b.shape);
  if (!shape.ok()) return shape.status();
  Tensor out(*shape);
  AddBroadcast(a.data.data(), a.shape, b.data.data(), b.shape, out.data.data(), out.shape);
  return out;
}

Tensor ReluRef(const Tensor& x) {
  Tensor y = x;
  for (float& v : y.data) v = std::max(v, 0.0f);
  return y;
}

}  // namespace numaserve::kernels
